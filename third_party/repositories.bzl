"""Warden's external repositories, for its own WORKSPACE and for a host workspace's.

A host workspace that depends on Warden adds (README "Use Warden from your project"):

    local_repository(name = "warden", path = "/path/to/warden")
    load("@warden//third_party:repositories.bzl", "warden_repositories")
    warden_repositories()

Both repositories are local: Debian's packages under /usr, and the LibTorch that
third_party/libtorch.bzl finds (WARDEN_LIBTORCH, the python3 on PATH, or Debian's).
"""

load("//third_party:libtorch.bzl", "libtorch_repository")

def warden_repositories():
    if not native.existing_rule("warden_system"):
        native.new_local_repository(
            name = "warden_system",
            path = "/usr",
            build_file = str(Label("//third_party:system.BUILD")),
        )
    if not native.existing_rule("warden_libtorch"):
        libtorch_repository(name = "warden_libtorch")
