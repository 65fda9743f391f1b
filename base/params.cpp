#include "base/params.h"

#include <arpa/inet.h>

#include <cassert>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace softrdma::params {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string_view> split_choices(std::string_view choices) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= choices.size()) {
    size_t bar = choices.find('|', start);
    if (bar == std::string_view::npos) bar = choices.size();
    out.push_back(choices.substr(start, bar - start));
    start = bar + 1;
  }
  return out;
}

/// 1073741824 → "1 GiB"; numbers that are not whole KiB/MiB/GiB → "".
std::string binary_units(int64_t v) {
  static constexpr std::pair<int, const char*> kUnits[] = {{30, "GiB"}, {20, "MiB"}, {10, "KiB"}};
  for (auto [shift, unit] : kUnits)
    if (v > 0 && v % (int64_t{1} << shift) == 0) return std::to_string(v >> shift) + " " + unit;
  return {};
}

/// Decimal integer, optionally negative, nothing else (no blanks, no '+', no suffix).
bool parse_decimal(const char* v, int64_t& out) {
  const char* digits = v[0] == '-' ? v + 1 : v;
  if (!std::isdigit(static_cast<unsigned char>(digits[0]))) return false;
  for (const char* c = digits; *c; ++c)
    if (!std::isdigit(static_cast<unsigned char>(*c))) return false;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (errno == ERANGE || *end != 0) return false;
  out = x;
  return true;
}

/// Byte count with an optional k/m/g (kb/kib, …) suffix, case-insensitive, ×1024ⁿ.
bool parse_size(const char* v, int64_t& out) {
  if (!std::isdigit(static_cast<unsigned char>(v[0]))) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno == ERANGE) return false;
  const std::string suffix = lower(end);
  unsigned shift = 0;
  if (suffix == "k" || suffix == "kib" || suffix == "kb")
    shift = 10;
  else if (suffix == "m" || suffix == "mib" || suffix == "mb")
    shift = 20;
  else if (suffix == "g" || suffix == "gib" || suffix == "gb")
    shift = 30;
  else if (!suffix.empty())
    return false;
  if (n > (static_cast<unsigned long long>(INT64_MAX) >> shift)) return false;
  out = static_cast<int64_t>(n << shift);
  return true;
}

}  // namespace

std::span<const Param> all() {
  return kParams;
}

std::string_view group_name(Group group) {
  switch (group) {
    case Group::kDevice:
      return "device";
    case Group::kCcl:
      return "ccl";
    case Group::kKv:
      return "kv";
    case Group::kCm:
      return "cm";
  }
  return {};
}

std::string accepted(const Param& p) {
  switch (p.kind) {
    case Kind::kInteger:
    case Kind::kSize: {
      std::string s = p.kind == Kind::kSize ? "a size in " : "an integer in ";
      s += std::to_string(p.min) + ".." + std::to_string(p.max);
      if (!p.unit.empty()) s += " " + std::string(p.unit);
      if (p.kind == Kind::kSize) {
        const std::string max = binary_units(p.max);
        s += " (" + (max.empty() ? "" : "≤ " + max + "; ") + "suffix k, m or g allowed)";
      }
      return s;
    }
    case Kind::kFlag:
      return "1/on or 0/off";
    case Kind::kChoice: {
      std::string s = "one of ";
      const auto choices = split_choices(p.choices);
      for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + std::string(choices[i]);
      return s;
    }
    case Kind::kIpv4:
      return "an IPv4 address (not 0.0.0.0)";
    case Kind::kIpv4List:
      return "an IPv4 address (not 0.0.0.0), or a comma-separated list of them";
    case Kind::kText:
      return std::string(p.choices);
  }
  return {};
}

std::vector<std::string> choices(const Param& p) {
  assert(p.kind == Kind::kChoice);
  std::vector<std::string> out;
  for (std::string_view c : split_choices(p.choices)) out.emplace_back(c);
  return out;
}

std::string malformed(const Param& p, std::string_view value) {
  return std::string(p.name) + ": expected " + accepted(p) + ", got '" + std::string(value) + "'";
}

const char* raw(const Param& p) {
  const char* v = std::getenv(std::string(p.name).c_str());
  if (v == nullptr || (*v == 0 && !p.empty_is_error)) return nullptr;
  return v;
}

bool read_integer(const Param& p, int64_t& out, std::string& error) {
  assert(p.kind == Kind::kInteger || p.kind == Kind::kSize);
  const char* v = raw(p);
  if (v == nullptr) return true;
  int64_t x = 0;
  const bool parsed = p.kind == Kind::kSize ? parse_size(v, x) : parse_decimal(v, x);
  if (!parsed || x < p.min || x > p.max) {
    error = malformed(p, v);
    return false;
  }
  out = x;
  return true;
}

bool read_flag(const Param& p, bool& out, std::string& error) {
  assert(p.kind == Kind::kFlag);
  const char* v = raw(p);
  if (v == nullptr) return true;
  const std::string_view s = v;
  if (s == "1" || s == "on") {
    out = true;
  } else if (s == "0" || s == "off") {
    out = false;
  } else {
    error = malformed(p, v);
    return false;
  }
  return true;
}

bool read_text(const Param& p, std::string& out, std::string& error) {
  assert(p.kind == Kind::kChoice || p.kind == Kind::kText);
  const char* v = raw(p);
  if (v == nullptr) return true;
  if (p.kind == Kind::kText) {
    out = v;
    return true;
  }
  const std::string given = p.ignore_case ? lower(v) : std::string(v);
  for (std::string_view c : split_choices(p.choices)) {
    if (given == c) {
      out = std::string(c);
      return true;
    }
  }
  error = malformed(p, v);
  return false;
}

bool read_ipv4_list(const Param& p, std::vector<uint32_t>& out, std::string& error) {
  assert(p.kind == Kind::kIpv4 || p.kind == Kind::kIpv4List);
  const char* v = raw(p);
  if (v == nullptr) return true;
  std::vector<uint32_t> ips;
  std::string_view rest(v);
  for (;;) {
    const size_t comma = p.kind == Kind::kIpv4List ? rest.find(',') : std::string_view::npos;
    const std::string one(rest.substr(0, comma));
    in_addr a{};
    if (inet_pton(AF_INET, one.c_str(), &a) != 1 || a.s_addr == 0) {
      error = malformed(p, v);
      return false;
    }
    ips.push_back(ntohl(a.s_addr));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  out = std::move(ips);
  return true;
}

bool read_ipv4(const Param& p, uint32_t& out, std::string& error) {
  std::vector<uint32_t> ips;
  if (!read_ipv4_list(p, ips, error)) return false;
  if (!ips.empty()) out = ips.front();
  return true;
}

int64_t integer(const Param& p, int64_t fallback) {
  std::string error;
  if (!read_integer(p, fallback, error)) throw std::invalid_argument(error);
  return fallback;
}

int64_t integer(const Param& p) {
  return integer(p, p.default_value);
}

bool flag(const Param& p, bool fallback) {
  std::string error;
  if (!read_flag(p, fallback, error)) throw std::invalid_argument(error);
  return fallback;
}

std::string text(const Param& p) {
  std::string out = p.kind == Kind::kChoice ? std::string(p.default_text) : std::string();
  std::string error;
  if (!read_text(p, out, error)) throw std::invalid_argument(error);
  return out;
}

std::string markdown_table(Group group) {
  std::string out =
      "| variable | default | accepted | meaning |\n"
      "|---|---|---|---|\n";
  for (const Param& p : kParams) {
    if (p.group != group) continue;
    out += "| `" + std::string(p.name) + "` | " + std::string(p.default_text) + " | " +
           accepted(p) + " | " + std::string(p.doc) + " |\n";
  }
  return out;
}

std::string help_text(Group group, size_t width) {
  constexpr size_t kIndent = 6;
  std::string out;
  for (const Param& p : kParams) {
    if (p.group != group) continue;
    out += "  " + std::string(p.name) + "  (default " + std::string(p.default_text) + "; " +
           accepted(p) + ")\n";
    // The doc, word-wrapped under the name.
    std::string line;
    size_t start = 0;
    const std::string_view doc = p.doc;
    while (start < doc.size()) {
      size_t end = doc.find(' ', start);
      if (end == std::string_view::npos) end = doc.size();
      const std::string_view word = doc.substr(start, end - start);
      if (!line.empty() && kIndent + line.size() + 1 + word.size() > width) {
        out += std::string(kIndent, ' ') + line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + std::string(word);
      start = end + 1;
    }
    if (!line.empty()) out += std::string(kIndent, ' ') + line + "\n";
  }
  return out;
}

}  // namespace softrdma::params
