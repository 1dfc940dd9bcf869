#include "tools/bench_report_lib.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace warden::tools {
namespace {

using nlohmann::json;

// Fields Google Benchmark writes for every run; anything else in a run is a user counter.
const char* const kStandardFields[] = {
    "name",         "family_index",     "per_family_instance_index", "run_name", "run_type",
    "repetitions",  "repetition_index", "threads",                   "iterations", "real_time",
    "cpu_time",     "time_unit",        "aggregate_name",            "aggregate_unit",
    "error_occurred", "error_message",  "label",                     "bytes_per_second",
    "items_per_second"};

bool IsStandardField(const std::string& key) {
  return std::find(std::begin(kStandardFields), std::end(kStandardFields), key) != std::end(kStandardFields);
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// Three significant digits.
std::string Sig3(double v) {
  const double a = std::fabs(v);
  if (a >= 100) return Fmt("%.0f", v);
  if (a >= 10) return Fmt("%.1f", v);
  return Fmt("%.2f", v);
}

// 1234567 -> "1.23M"; used for counters and throughput.
std::string Si(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return Sig3(v / 1e9) + "G";
  if (a >= 1e6) return Sig3(v / 1e6) + "M";
  if (a >= 1e3) return Sig3(v / 1e3) + "k";
  if (v == std::floor(v)) return Fmt("%.0f", v);
  return Sig3(v);
}

double ToNs(double t, const std::string& unit) {
  if (unit == "us") return t * 1e3;
  if (unit == "ms") return t * 1e6;
  if (unit == "s") return t * 1e9;
  return t;
}

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A table cell's text: '|' would end the cell.
std::string EscapeCell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// One path's measurement (median over repetitions).
struct Cell {
  bool present = false;
  std::string error;
  double ns = 0;
  double bytes_per_second = -1;
  std::vector<std::pair<std::string, double>> counters;  // in JSON order
  std::string label;
};

struct Row {
  std::string workload;
  bool wall = false;  // times are real time
  std::vector<std::string> paths;  // in JSON order
  std::map<std::string, Cell> cells;
};

// Splits a run name into (workload, path, wall, threads part).
void ParseName(const std::string& run_name, std::string* workload, std::string* path, bool* wall,
               std::string* threads) {
  std::vector<std::string> parts;
  std::stringstream in(run_name);
  for (std::string p; std::getline(in, p, '/');) {
    if (p == "real_time" || p == "manual_time") {
      *wall = true;
    } else if (StartsWith(p, "threads:")) {
      *threads = p.substr(8);
    } else if (p == "process_time" || StartsWith(p, "iterations:") || StartsWith(p, "repeats:") ||
               StartsWith(p, "min_time:") || StartsWith(p, "min_warmup_time:")) {
    } else {
      parts.push_back(p);
    }
  }
  *path = parts.empty() ? "" : parts.back();
  if (!parts.empty()) parts.pop_back();
  workload->clear();
  for (size_t i = 0; i < parts.size(); ++i) *workload += (i ? "/" : "") + parts[i];
}

// Collects the runs of each (workload, path), medians over repetitions.
std::vector<Row> Rows(const json& benchmarks, const std::string& clock) {
  struct Acc {
    std::vector<double> ns, bps;
    std::map<std::string, std::vector<double>> counters;
    std::vector<std::string> counter_order;
    bool median_aggregate = false;
    Cell median;
    std::string error, label;
  };
  std::vector<Row> rows;
  std::map<std::string, size_t> row_of;
  std::map<std::string, std::map<std::string, Acc>> acc;
  for (const json& b : benchmarks) {
    const std::string run_name = b.value("run_name", b.value("name", ""));
    std::string workload, path, threads;
    bool wall = clock == "real";
    ParseName(run_name, &workload, &path, &wall, &threads);
    if (!threads.empty()) workload += " (" + threads + (threads == "1" ? " thread)" : " threads)");
    if (row_of.count(workload) == 0) {
      row_of[workload] = rows.size();
      rows.push_back({workload, wall, {}, {}});
    }
    Row& row = rows[row_of[workload]];
    if (std::find(row.paths.begin(), row.paths.end(), path) == row.paths.end()) row.paths.push_back(path);
    Acc& a = acc[workload][path];
    if (b.value("error_occurred", false)) {
      a.error = b.value("error_message", "error");
      continue;
    }
    const std::string run_type = b.value("run_type", "iteration");
    const std::string aggregate = b.value("aggregate_name", "");
    if (run_type == "aggregate" && aggregate != "median") continue;
    const std::string unit = b.value("time_unit", "ns");
    const double ns = ToNs(wall ? b.value("real_time", 0.0) : b.value("cpu_time", 0.0), unit);
    if (b.contains("label")) a.label = b["label"].get<std::string>();
    std::vector<std::pair<std::string, double>> counters;
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (!IsStandardField(it.key()) && it.value().is_number()) counters.emplace_back(it.key(), it.value().get<double>());
    }
    if (run_type == "aggregate") {
      a.median_aggregate = true;
      a.median.ns = ns;
      a.median.bytes_per_second = b.value("bytes_per_second", -1.0);
      a.median.counters = counters;
      continue;
    }
    a.ns.push_back(ns);
    if (b.contains("bytes_per_second")) a.bps.push_back(b["bytes_per_second"].get<double>());
    for (const auto& [key, value] : counters) {
      if (a.counters.count(key) == 0) a.counter_order.push_back(key);
      a.counters[key].push_back(value);
    }
  }
  for (Row& row : rows) {
    for (const std::string& path : row.paths) {
      Acc& a = acc[row.workload][path];
      Cell c;
      c.present = true;
      c.error = a.error;
      c.label = a.label;
      if (a.median_aggregate) {
        c.ns = a.median.ns;
        c.bytes_per_second = a.median.bytes_per_second;
        c.counters = a.median.counters;
      } else if (!a.ns.empty()) {
        c.ns = MedianOf(a.ns);
        if (!a.bps.empty()) c.bytes_per_second = MedianOf(a.bps);
        for (const std::string& key : a.counter_order) c.counters.emplace_back(key, MedianOf(a.counters[key]));
      } else if (c.error.empty()) {
        c.error = "no runs";
      }
      row.cells[path] = c;
    }
  }
  return rows;
}

std::string TimeCell(const Row& row, const std::string& path) {
  auto it = row.cells.find(path);
  if (it == row.cells.end()) return "";
  if (!it->second.error.empty()) return "error";
  return FormatNs(it->second.ns);
}

std::string RatioCell(const Row& row, const std::string& path) {
  auto e = row.cells.find("eager"), w = row.cells.find(path);
  if (e == row.cells.end() || w == row.cells.end() || !e->second.error.empty() || !w->second.error.empty() ||
      w->second.ns <= 0) {
    return "";
  }
  const double r = e->second.ns / w->second.ns;
  return (r >= 10 ? Fmt("%.1f", r) : Fmt("%.2f", r)) + "x";
}

bool IsMainPath(const std::string& p) { return p == "eager" || p == "aten" || p == "cpp"; }

std::string Notes(const Row& row) {
  std::vector<std::string> notes;
  for (const std::string& path : row.paths) {
    const Cell& c = row.cells.at(path);
    if (!c.error.empty()) notes.push_back(path + " failed: " + c.error);
    if (!IsMainPath(path) && c.error.empty()) notes.push_back(path + " " + FormatNs(c.ns));
    if (!c.label.empty()) notes.push_back(path + ": " + c.label);
  }
  // Throughput, when measured: GB/s per path.
  std::string gbs;
  for (const std::string& path : row.paths) {
    const Cell& c = row.cells.at(path);
    if (c.error.empty() && c.bytes_per_second > 0) {
      gbs += (gbs.empty() ? "GB/s: " : ", ") + path + " " + Sig3(c.bytes_per_second / 1e9);
    }
  }
  if (!gbs.empty()) notes.push_back(gbs);
  // The physical reference: a Warden path's bandwidth as a fraction of the copy's.
  if (auto copy = row.cells.find("copy"); copy != row.cells.end() && copy->second.bytes_per_second > 0) {
    for (const char* path : {"cpp"}) {
      auto it = row.cells.find(path);
      if (it == row.cells.end() || !it->second.error.empty() || it->second.bytes_per_second <= 0) continue;
      notes.push_back(std::string(path) + " at " +
                      Fmt("%.0f", 100 * it->second.bytes_per_second / copy->second.bytes_per_second) +
                      "% of copy bandwidth");
    }
  }
  // Counters: one note per counter; a single value when every path agrees.
  std::vector<std::string> names;
  for (const std::string& path : row.paths) {
    for (const auto& [key, value] : row.cells.at(path).counters) {
      if (std::find(names.begin(), names.end(), key) == names.end()) names.push_back(key);
    }
  }
  for (const std::string& key : names) {
    std::vector<std::pair<std::string, double>> values;
    for (const std::string& path : row.paths) {
      for (const auto& [k, v] : row.cells.at(path).counters) {
        if (k == key) values.emplace_back(path, v);
      }
    }
    const bool same = std::all_of(values.begin(), values.end(), [&](const auto& pv) { return pv.second == values[0].second; });
    std::string note = key + ": ";
    if (same && values.size() > 1) {
      note += Si(values[0].second);
    } else {
      for (size_t i = 0; i < values.size(); ++i) note += (i ? ", " : "") + values[i].first + " " + Si(values[i].second);
    }
    notes.push_back(note);
  }
  std::string out;
  for (size_t i = 0; i < notes.size(); ++i) out += (i ? "; " : "") + notes[i];
  return out;
}

std::string ContextString(const json& context, const char* key) {
  if (!context.contains(key)) return "";
  const json& v = context[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_number()) return Sig3(v.get<double>());
  return v.dump();
}

std::string Header(const json& context, const ReportOptions& options) {
  std::string date = ContextString(context, "date");
  const std::string host = ContextString(context, "host_name");
  const std::string cpus = ContextString(context, "num_cpus");
  const std::string mhz = ContextString(context, "mhz_per_cpu");
  const std::string model = ContextString(context, "cpu_model");
  std::string blas = ContextString(context, "blas");
  if (blas.empty()) blas = options.blas.empty() ? "not recorded" : options.blas;
  std::string out = "Measured " + (date.empty() ? std::string("(date not recorded)") : date);
  out += " on " + (host.empty() ? std::string("an unnamed host") : host);
  std::string machine;
  if (!cpus.empty()) machine += cpus + " CPUs";
  if (!mhz.empty()) machine += (machine.empty() ? "" : " at ") + mhz + " MHz";
  if (!model.empty()) machine += (machine.empty() ? "" : ", ") + model;
  if (!machine.empty()) out += " (" + machine + ")";
  out += "; BLAS: " + blas;
  const std::string torch = ContextString(context, "torch_version");
  if (!torch.empty()) out += "; LibTorch " + torch;
  const std::string intra = ContextString(context, "intra_op_threads");
  if (!intra.empty()) out += ", " + intra + (intra == "1" ? " intra-op thread" : " intra-op threads");
  const std::string load = context.contains("load_avg") && context["load_avg"].is_array() && !context["load_avg"].empty()
                               ? Sig3(context["load_avg"][0].get<double>())
                               : "";
  if (!load.empty()) out += "; load average " + load + " at the start";
  return out + ".";
}

}  // namespace

std::string FormatNs(double ns) {
  const double a = std::fabs(ns);
  if (a >= 1e9) return Sig3(ns / 1e9) + " s";
  if (a >= 1e6) return Sig3(ns / 1e6) + " ms";
  if (a >= 1e3) return Sig3(ns / 1e3) + " µs";
  return Sig3(ns) + " ns";
}

std::string MarkdownReport(const json& input, const ReportOptions& options) {
  if (!input.contains("benchmarks") || !input["benchmarks"].is_array()) {
    throw std::runtime_error("no \"benchmarks\" array in the input (run with --benchmark_format=json)");
  }
  const json context = input.value("context", json::object());
  const std::vector<Row> rows = Rows(input["benchmarks"], options.clock);
  std::string out = Header(context, options) + "\n\n";
  out += "| workload | eager | aten | cpp | aten vs eager | cpp vs eager | notes |\n";
  out += "| --- | ---: | ---: | ---: | ---: | ---: | --- |\n";
  bool any_wall = false;
  for (const Row& row : rows) {
    any_wall |= row.wall && options.clock != "real";
    out += "| " + EscapeCell(row.workload) + (row.wall && options.clock != "real" ? " (wall)" : "") + " | " +
           TimeCell(row, "eager") + " | " + TimeCell(row, "aten") + " | " + TimeCell(row, "cpp") + " | " +
           RatioCell(row, "aten") + " | " + RatioCell(row, "cpp") + " | " + EscapeCell(Notes(row)) + " |\n";
  }
  out += "\nTimes per call, ";
  out += options.clock == "real" ? "real time" : "CPU time";
  if (any_wall) out += " (real time for rows marked (wall))";
  out += ", median over repetitions if any. \"x vs eager\" = eager time / Warden time: above 1 is faster "
         "than eager.";
  if (any_wall) {
    out += " Multi-thread rows: time = wall time / calls of all threads (the inverse of total throughput); "
           "calls_per_s_per_thread is each thread's rate.";
  }
  return out + "\n";
}

}  // namespace warden::tools
