"""The LibTorch Warden builds against (README "Which LibTorch"; Note [Which LibTorch] in tracer/torch_compat.h).

`libtorch_repository` finds LibTorch, in this order:
  1. WARDEN_LIBTORCH (environment or `--repo_env`): a libtorch zip's root, a wheel's
     `site-packages/torch`, a virtual environment that has torch installed, or `/usr`;
  2. the `torch` package of the `python3` on PATH;
  3. Debian's `libtorch-dev` under /usr.
It reads the version from `torch/version.h`, refuses a LibTorch built with the old C++ ABI
(`_GLIBCXX_USE_CXX11_ABI=0`: Debian's Abseil, GoogleTest and Benchmark use the new one), and
exposes `@warden_libtorch//:torch` plus the version as `WARDEN_TORCH_VERSION_{MAJOR,MINOR,PATCH}`.
"""

_VERSION_H = "include/torch/csrc/api/include/torch/version.h"

def _fail(msg):
    fail("\nwarden: cannot use LibTorch: " + msg + "\n")

def _abs(ctx, path):
    if path.startswith("/"):
        return ctx.path(path)
    # Relative to the main workspace (where `bazel` runs).
    return ctx.path(Label("@//:WORKSPACE")).dirname.get_child(path)

def _python_torch(ctx):
    """The `torch` package directory of the python3 on PATH, or None (torch is not imported)."""
    python = ctx.which("python3")
    if python == None:
        return None
    res = ctx.execute([python, "-c", "import importlib.util as u; s = u.find_spec('torch'); " +
                                     "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')"], timeout = 30)
    out = res.stdout.strip()
    if res.return_code != 0 or not out:
        return None
    return ctx.path(out)

def _direct_layout(root):
    """(include dir, lib dir) when root itself is a LibTorch (zip, wheel dir or /usr), or None."""
    include = root.get_child("include")
    if include.get_child("torch").exists and root.get_child("lib").get_child("libtorch_cpu.so").exists:
        return (include, root.get_child("lib"))  # libtorch zip or wheel
    for arch in ["x86_64-linux-gnu", "aarch64-linux-gnu"]:
        libdir = root.get_child("lib").get_child(arch)
        if libdir.get_child("libtorch_cpu.so").exists and include.get_child("torch").exists:
            return (include, libdir)  # Debian's libtorch-dev
    return None

def _layout(ctx, root):
    """(include dir, lib dir) of a LibTorch root, or None."""
    found = _direct_layout(root)
    if found != None:
        return found
    # A virtual environment (or any prefix) with torch installed under lib/pythonX.Y/site-packages.
    # (Starlark has no recursion: the prefix case looks one level down, directly.)
    lib = root.get_child("lib")
    if lib.exists:
        for d in lib.readdir():
            if d.basename.startswith("python"):
                torch = d.get_child("site-packages").get_child("torch")
                if torch.exists:
                    found = _direct_layout(torch)
                    if found != None:
                        return found
    return None

def _read_version(ctx, include):
    # 2.x keeps the numbers in torch/headeronly/version.h, which the API's version.h includes.
    text = ""
    for f in [include.get_child("torch").get_child("headeronly").get_child("version.h"),
              include.get_child("torch").get_child("csrc").get_child("api").get_child("include").get_child("torch").get_child("version.h")]:
        if f.exists:
            text += ctx.read(f) + "\n"
    version = {}
    for line in text.splitlines():
        parts = [p for p in line.replace("\t", " ").split(" ") if p]
        if len(parts) == 3 and parts[0] == "#define" and parts[1] in ["TORCH_VERSION_MAJOR", "TORCH_VERSION_MINOR", "TORCH_VERSION_PATCH"]:
            version[parts[1]] = parts[2]
    if len(version) != 3:
        _fail("%s (or torch/headeronly/version.h) under %s has no TORCH_VERSION_MAJOR/MINOR/PATCH" % (_VERSION_H, include))
    return (int(version["TORCH_VERSION_MAJOR"]), int(version["TORCH_VERSION_MINOR"]), int(version["TORCH_VERSION_PATCH"]))

def _cxx11_abi(ctx, libdir):
    """True when libc10 was built with _GLIBCXX_USE_CXX11_ABI=1 (it exports std::__cxx11 names)."""
    nm = ctx.which("nm")
    if nm == None:
        _fail("`nm` (binutils) is needed to read LibTorch's C++ ABI")
    res = ctx.execute([nm, "-D", "--defined-only", str(libdir.get_child("libc10.so"))], timeout = 60)
    if res.return_code != 0:
        _fail("cannot read %s: %s" % (libdir.get_child("libc10.so"), res.stderr))
    return "__cxx11" in res.stdout

def _libtorch_impl(ctx):
    requested = ctx.os.environ.get("WARDEN_LIBTORCH", "").strip()
    if requested:
        root = _abs(ctx, requested)
        if not root.exists:
            _fail("WARDEN_LIBTORCH=%s does not exist" % requested)
        source = "WARDEN_LIBTORCH"
    else:
        root = _python_torch(ctx)
        source = "python3 on PATH"
        if root == None or _layout(ctx, root) == None:
            root = ctx.path("/usr")
            source = "Debian's libtorch-dev"
    layout = _layout(ctx, root)
    if layout == None:
        _fail(("%s (from %s) is not a LibTorch: expected include/torch and lib/libtorch_cpu.so (a " +
               "libtorch zip or a wheel's site-packages/torch), a virtual environment with torch " +
               "installed, or /usr with Debian's libtorch-dev") % (root, source))
    include, libdir = layout
    major, minor, patch = _read_version(ctx, include)
    if not _cxx11_abi(ctx, libdir):
        _fail(("LibTorch %d.%d.%d at %s was built with the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0); " +
               "Debian's Abseil, GoogleTest and Benchmark use the C++11 ABI, so it cannot link with " +
               "them. Use a cxx11-abi libtorch zip or a wheel from PyTorch 2.7 on.") % (major, minor, patch, libdir))
    if (major, minor) < (1, 13):
        _fail("LibTorch %d.%d.%d is older than 1.13, the oldest Warden supports" % (major, minor, patch))

    system = str(include) == "/usr/include"
    if system:
        # /usr/include is searched already; adding it with -isystem breaks #include_next.
        ctx.symlink(include.get_child("torch").get_child("csrc").get_child("api").get_child("include"), "api")
        includes = ["api"]
    else:
        ctx.symlink(include, "include")
        includes = ["include", "include/torch/csrc/api/include"]
    libs = "-L{d} -Wl,-rpath,{d}".format(d = libdir) if not system else ""
    linkopts = ([libs] if libs else []) + ["-ltorch", "-ltorch_cpu", "-lc10", "-lpthread"]
    ctx.file("BUILD.bazel", """# Generated by //third_party:libtorch.bzl from {source}.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    includes = {includes},
    defines = [
        "WARDEN_TORCH_VERSION_MAJOR={major}",
        "WARDEN_TORCH_VERSION_MINOR={minor}",
        "WARDEN_TORCH_VERSION_PATCH={patch}",
    ],
    linkopts = {linkopts},
)

# What the build used, for scripts (tools/libtorch_info.sh) and the CMake package.
exports_files(["info.txt"])
""".format(source = source, includes = repr(includes), major = major, minor = minor, patch = patch,
           linkopts = repr(linkopts)))
    ctx.file("info.txt", "version={}.{}.{}\nsource={}\nroot={}\ninclude={}\nlib={}\n".format(
        major, minor, patch, source, root, include, libdir))
    ctx.file("WORKSPACE", "workspace(name = \"{}\")\n".format(ctx.name))

libtorch_repository = repository_rule(
    implementation = _libtorch_impl,
    environ = ["WARDEN_LIBTORCH", "PATH"],
    local = True,
)
