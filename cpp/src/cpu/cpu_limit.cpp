#include "cpu/cpu_limit.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace rnncore::cpu {

#if defined(__linux__)
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Whether the comma-separated list holds item.
bool has_item(const std::string& list, const std::string& item) {
  std::istringstream in(list);
  for (std::string s; std::getline(in, s, ',');)
    if (s == item) return true;
  return false;
}

// mountinfo writes a space, tab, newline or backslash in a path as \ and three octal digits.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto digit = [&](size_t j) { return j < s.size() && s[j] >= '0' && s[j] <= '7'; };
    if (s[i] == '\\' && digit(i + 1) && digit(i + 2) && digit(i + 3)) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Mount {
  std::string root, point;  // the hierarchy's directory mounted, and where
};

// The mount of the v2 hierarchy, or of the v1 hierarchy with the cpu controller, from
// mountinfo's lines: "id parent major:minor root point options [optional...] - type source
// super-options".
bool find_mount(const std::string& mountinfo, bool v2, Mount* out) {
  std::istringstream in(mountinfo);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, options, field, type, source, super;
    if (!(f >> id >> parent >> dev >> root >> point >> options)) continue;
    while (f >> field && field != "-") {
    }
    if (field != "-" || !(f >> type >> source >> super)) continue;
    if (v2 ? type == "cgroup2" : type == "cgroup" && has_item(super, "cpu")) {
      *out = {unescape(root), unescape(point)};
      return true;
    }
  }
  return false;
}

// The quota of one group's directory in CPUs, or 0 for none.
double quota_of(const std::string& dir, bool v2) {
  double quota = 0, period = 0;
  if (v2) {
    std::istringstream f(read_file(dir + "/cpu.max"));  // "max 100000" or "150000 100000"
    std::string q;
    if (!(f >> q >> period) || q == "max") return 0;
    quota = std::strtod(q.c_str(), nullptr);
  } else {
    std::istringstream q(read_file(dir + "/cpu.cfs_quota_us")),  // -1: none
        p(read_file(dir + "/cpu.cfs_period_us"));
    if (!(q >> quota) || !(p >> period)) return 0;
  }
  return quota > 0 && period > 0 ? quota / period : 0;
}

}  // namespace
#endif

double cgroup_cpu_limit(const std::string& root) {
#if defined(__linux__)
  const std::string mounts = read_file(root + "/proc/self/mountinfo");
  std::istringstream groups(read_file(root + "/proc/self/cgroup"));
  double limit = 0;
  // Lines "0::/path" (v2) and "n:controllers:/path" (v1); a hybrid system has both, and
  // every quota found counts.
  for (std::string line; std::getline(groups, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const bool v2 = line.compare(0, a, "0") == 0 && b == a + 1;
    if (!v2 && !has_item(line.substr(a + 1, b - a - 1), "cpu")) continue;
    Mount m;
    if (!find_mount(mounts, v2, &m)) continue;
    // The path is the hierarchy's; the mount shows it from m.root down.
    std::string rel = line.substr(b + 1);
    if (m.root != "/") {
      if (rel.compare(0, m.root.size(), m.root) != 0 ||
          (rel.size() > m.root.size() && rel[m.root.size()] != '/'))
        continue;
      rel.erase(0, m.root.size());
    }
    for (;;) {
      const double q = quota_of(root + m.point + rel, v2);
      if (q > 0 && (limit == 0 || q < limit)) limit = q;
      if (rel.empty() || rel == "/") break;
      rel.erase(rel.rfind('/'));
    }
  }
  return limit;
#else
  (void)root;
  return 0;
#endif
}

}  // namespace rnncore::cpu
