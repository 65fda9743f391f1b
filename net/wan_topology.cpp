// Topology file parsing and lookup; see wan_topology.h for the format.
#include "net/wan_topology.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace softrdma::net {

namespace {

bool parse_ip(const std::string& s, uint32_t& out) {
  in_addr a{};
  if (::inet_pton(AF_INET, s.c_str(), &a) != 1) return false;
  out = ntohl(a.s_addr);
  return true;
}

bool parse_range(const std::string& s, WanTopology::Range& r) {
  if (auto slash = s.find('/'); slash != std::string::npos) {
    uint32_t base;
    const std::string bits = s.substr(slash + 1);
    char* end = nullptr;
    const long n = std::strtol(bits.c_str(), &end, 10);
    if (!parse_ip(s.substr(0, slash), base) || bits.empty() || *end || n < 0 || n > 32)
      return false;
    const uint32_t mask = n == 0 ? 0 : ~uint32_t{0} << (32 - n);
    r = {base & mask, (base & mask) | ~mask};
    return true;
  }
  if (auto dash = s.find('-'); dash != std::string::npos)
    return parse_ip(s.substr(0, dash), r.first) && parse_ip(s.substr(dash + 1), r.last) &&
           r.first <= r.last;
  if (!parse_ip(s, r.first)) return false;
  r.last = r.first;
  return true;
}

bool contains(const WanTopology::Site& s, uint32_t ip) {
  for (const auto& r : s.ranges)
    if (ip >= r.first && ip <= r.last) return true;
  return false;
}

bool overlaps(const WanTopology::Site& s, const WanTopology::Range& x) {
  for (const auto& r : s.ranges)
    if (x.first <= r.last && r.first <= x.last) return true;
  return false;
}

}  // namespace

int WanTopology::site_of(uint32_t ip) const {
  for (size_t i = 0; i < sites.size(); ++i)
    if (contains(sites[i], ip)) return static_cast<int>(i);
  return -1;
}

const WanTopology::Link* WanTopology::link_for(uint32_t src, uint32_t dst) const {
  if (src == dst) return nullptr;
  if (one_line()) return &links[0];
  const int a = site_of(src), b = site_of(dst);
  if (a < 0 || b < 0 || a == b) return nullptr;
  for (const Link& l : links)
    if (l.from == a && l.to == b) return &l;
  return nullptr;
}

uint64_t WanTopology::egress_rate_bps(uint32_t ip) const {
  const int site = site_of(ip);
  uint64_t fastest = 0;
  for (const Link& l : links) {
    if (l.from >= 0 && (site < 0 || l.from != site)) continue;
    if (l.params.rate_bps == 0) return 0;  // an unlimited link: no rate to size a port for
    fastest = std::max(fastest, l.params.rate_bps);
  }
  return fastest;
}

bool parse_wan_topology(const std::string& text, WanTopology& out, std::string& error) {
  WanTopology t;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  bool statements = false;
  std::string one_line;
  auto fail = [&](const std::string& why) {
    error = "line " + std::to_string(lineno) + ": " + why;
    return false;
  };
  auto site_index = [&t](const std::string& name) {
    for (size_t i = 0; i < t.sites.size(); ++i)
      if (t.sites[i].name == name) return static_cast<int>(i);
    return -1;
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string word;
    if (!(ls >> word)) continue;
    if (word == "site") {
      statements = true;
      std::string name;
      if (!(ls >> name)) return fail("site without a name");
      int idx = site_index(name);
      if (idx < 0) {
        t.sites.push_back({name, {}});
        idx = static_cast<int>(t.sites.size()) - 1;
      }
      std::string a;
      int n = 0;
      while (ls >> a) {
        WanTopology::Range r;
        if (!parse_range(a, r)) return fail("bad address '" + a + "' in site " + name);
        for (size_t i = 0; i < t.sites.size(); ++i)
          if (overlaps(t.sites[i], r))
            return fail("address '" + a + "' already in site " + t.sites[i].name);
        t.sites[static_cast<size_t>(idx)].ranges.push_back(r);
        ++n;
      }
      if (n == 0) return fail("site " + name + " lists no address");
    } else if (word == "link") {
      statements = true;
      std::string a, arrow, b;
      if (!(ls >> a >> arrow)) return fail("link needs two sites");
      bool both = false;
      if (arrow == "<->") {
        both = true;
        if (!(ls >> b)) return fail("link needs two sites");
      } else {
        b = arrow;
      }
      const int ia = site_index(a), ib = site_index(b);
      if (ia < 0) return fail("unknown site '" + a + "' (declare it with 'site' first)");
      if (ib < 0) return fail("unknown site '" + b + "' (declare it with 'site' first)");
      if (ia == ib) return fail("a link joins two different sites");
      std::string rest, tok;
      while (ls >> tok) rest += tok + ",";
      LinkParams p;
      std::string perr;
      if (!parse_link_params(rest, p, perr)) return fail(perr);
      for (auto [f, to] : {std::pair{ia, ib}, std::pair{ib, ia}}) {
        if (!both && f != ia) continue;
        for (const auto& l : t.links)
          if (l.from == f && l.to == to)
            return fail("link " + t.sites[static_cast<size_t>(f)].name + " -> " +
                        t.sites[static_cast<size_t>(to)].name + " given twice");
        t.links.push_back({f, to, p});
      }
    } else {
      if (statements) return fail("unknown statement '" + word + "' (expected site or link)");
      one_line += line + ",";
    }
  }
  if (!one_line.empty()) {
    if (statements) return fail("parameters outside a link statement");
    LinkParams p;
    std::string perr;
    lineno = 1;
    if (!parse_link_params(one_line, p, perr)) return fail(perr);
    t.links.push_back({-1, -1, p});
  }
  out = std::move(t);
  return true;
}

namespace {

bool read_file(const std::string& path, std::string& text, std::string& error) {
  std::ifstream f(path);
  if (!f) {
    error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  text = ss.str();
  return true;
}

}  // namespace

bool load_wan_topology(const std::string& path, WanTopology& out, std::string& error) {
  std::string text;
  return read_file(path, text, error) && parse_wan_topology(text, out, error);
}

bool read_wan_spec(const std::string& value, WanTopology& out, std::string& text,
                   std::string& error) {
  struct stat st;
  if (::stat(value.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    if (!read_file(value, text, error)) return false;
  } else {
    text = value;
  }
  return parse_wan_topology(text, out, error);
}

}  // namespace softrdma::net
