"""Merges the JSON lines of bench/compare_warden.cc and bench/torch_compile_compare.py into the
README's Markdown table (bench/compare.sh)."""
import json
import sys

rows = {}
order = []
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r["workload"] not in rows:
                rows[r["workload"]] = {}
                order.append(r["workload"])
            rows[r["workload"]][r["system"]] = r


def us(r, system):
    x = r.get(system)
    return "" if x is None else ("%.2f" % x["us"] if x["us"] < 100 else "%.0f" % x["us"])


def compiles(r, system):
    x = r.get(system)
    return "" if x is None or system.startswith("eager") else str(x["compiles"])


def ratio(r, eager, system):
    if eager not in r or system not in r or r[system]["us"] <= 0:
        return ""
    return "%.2fx" % (r[eager]["us"] / r[system]["us"])


print("| workload | eager C++ µs | Warden cpp µs (vs eager C++) | Warden aten µs | eager Python µs "
      "| torch.compile µs (vs eager Python) | compiles: Warden / torch.compile |")
print("|---|---:|---:|---:|---:|---:|---:|")
for w in order:
    r = rows[w]
    cpp = us(r, "warden-cpp")
    if cpp and "eager-cpp" in r:
        cpp += " (%s)" % ratio(r, "eager-cpp", "warden-cpp")
    tc = us(r, "torch.compile")
    if tc and "eager-py" in r:
        tc += " (%s)" % ratio(r, "eager-py", "torch.compile")
    print("| %s | %s | %s | %s | %s | %s | %s / %s |" % (
        w, us(r, "eager-cpp"), cpp, us(r, "warden-aten"), us(r, "eager-py"), tc,
        compiles(r, "warden-cpp"), compiles(r, "torch.compile")))
