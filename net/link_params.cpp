// Parsing and derived values of LinkParams; see link_params.h.
#include "net/link_params.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace softrdma::net {

namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// A number followed by a unit suffix; false if the number is missing or malformed.
bool split_number(const std::string& v, double& number, std::string& unit) {
  if (v.empty()) return false;
  char* end = nullptr;
  number = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || !std::isfinite(number) || number < 0) return false;
  unit = lower(std::string(end));
  return true;
}

bool parse_duration_ns(const std::string& v, uint64_t& out) {
  double x;
  std::string u;
  if (!split_number(v, x, u)) return false;
  double scale;
  if (u.empty() || u == "ms")
    scale = 1e6;
  else if (u == "us" || u == "µs")
    scale = 1e3;
  else if (u == "ns")
    scale = 1;
  else if (u == "s")
    scale = 1e9;
  else
    return false;
  const double ns = x * scale;
  if (ns > 3.6e12) return false;  // an hour of delay is a typo
  out = static_cast<uint64_t>(std::llround(ns));
  return true;
}

bool parse_probability(const std::string& v, double& out) {
  double x;
  std::string u;
  if (!split_number(v, x, u)) return false;
  if (u == "%")
    x /= 100.0;
  else if (!u.empty())
    return false;
  if (x > 1.0) return false;
  out = x;
  return true;
}

bool parse_rate_bps(const std::string& v, uint64_t& out) {
  double x;
  std::string u;
  if (!split_number(v, x, u)) return false;
  // "MB/s" (capital B) is bytes per second; "bit", "bps", "b/s" or nothing: bits.
  const bool bytes = v.size() >= 3 && v.compare(v.size() - 3, 3, "B/s") == 0;
  for (const char* tail : {"b/s", "bit", "bps"})
    if (u.size() >= 3 && u.compare(u.size() - 3, 3, tail) == 0) {
      u.resize(u.size() - 3);
      break;
    }
  double scale;
  if (u.empty())
    scale = 1;
  else if (u == "k")
    scale = 1e3;
  else if (u == "m")
    scale = 1e6;
  else if (u == "g")
    scale = 1e9;
  else if (u == "t")
    scale = 1e12;
  else
    return false;
  const double bps = x * scale * (bytes ? 8 : 1);
  if (bps < 1 || bps > 1e13) return false;
  out = static_cast<uint64_t>(std::llround(bps));
  return true;
}

// Bytes with binary suffixes, or "Nbdp" (returned as a negative multiple in `bdp`).
bool parse_bytes(const std::string& v, uint64_t& out, double& bdp) {
  double x;
  std::string u;
  if (!split_number(v, x, u)) return false;
  bdp = 0;
  if (u == "bdp") {
    if (x <= 0) return false;
    bdp = x;
    out = 0;
    return true;
  }
  double scale;
  if (u.empty() || u == "b")
    scale = 1;
  else if (u == "k" || u == "kb" || u == "kib")
    scale = 1024;
  else if (u == "m" || u == "mb" || u == "mib")
    scale = 1024.0 * 1024;
  else if (u == "g" || u == "gb" || u == "gib")
    scale = 1024.0 * 1024 * 1024;
  else
    return false;
  const double b = x * scale;
  if (b > 1e12) return false;
  out = static_cast<uint64_t>(std::llround(b));
  return true;
}

uint64_t bdp_bytes(const LinkParams& p) {
  // rate × round trip (2 × the one-way delay), bytes.
  return static_cast<uint64_t>(static_cast<double>(p.rate_bps) / 8.0 *
                               (2.0 * static_cast<double>(p.delay_ns)) / 1e9);
}

}  // namespace

double GilbertElliott::mean_loss() const {
  if (!enabled()) return 0.0;
  return (p * loss_bad + r * loss_good) / (p + r);
}

bool LinkParams::shaped() const {
  return delay_ns || jitter_ns || loss > 0 || burst.enabled() || reorder > 0 || duplicate > 0 ||
         corrupt > 0 || rate_bps;
}

uint64_t LinkParams::queue_limit() const {
  if (!rate_bps) return 0;
  if (queue_bytes) return queue_bytes;
  return std::max<uint64_t>(64 * 1024, bdp_bytes(*this));
}

bool parse_link_params(const std::string& spec, LinkParams& out, std::string& error) {
  LinkParams p = out;
  double queue_bdp = 0, ecn_bdp = 0;
  std::string item;
  std::vector<std::string> items;
  for (char ch : spec + ",") {
    if (ch == ',' || ch == ' ' || ch == '\t') {
      if (!item.empty()) items.push_back(item);
      item.clear();
    } else {
      item += ch;
    }
  }
  for (const std::string& it : items) {
    const auto eq = it.find('=');
    if (eq == std::string::npos) {
      error = "expected key=value, got '" + it + "'";
      return false;
    }
    const std::string key = lower(it.substr(0, eq)), val = it.substr(eq + 1);
    bool ok = true;
    if (key == "delay") {
      ok = parse_duration_ns(val, p.delay_ns);
    } else if (key == "jitter") {
      ok = parse_duration_ns(val, p.jitter_ns);
    } else if (key == "dist") {
      const std::string d = lower(val);
      if (d == "normal")
        p.jitter_dist = JitterDist::kNormal;
      else if (d == "uniform")
        p.jitter_dist = JitterDist::kUniform;
      else
        ok = false;
    } else if (key == "loss") {
      ok = parse_probability(val, p.loss);
    } else if (key == "burst") {
      GilbertElliott g;
      std::vector<std::string> f;
      std::string cur;
      for (char ch : val + ":") {
        if (ch == ':') {
          f.push_back(cur);
          cur.clear();
        } else {
          cur += ch;
        }
      }
      ok = f.size() >= 2 && f.size() <= 4 && parse_probability(f[0], g.p) &&
           parse_probability(f[1], g.r) && g.r > 0 &&
           (f.size() < 3 || parse_probability(f[2], g.loss_bad)) &&
           (f.size() < 4 || parse_probability(f[3], g.loss_good));
      if (ok) p.burst = g;
    } else if (key == "reorder") {
      ok = parse_probability(val, p.reorder);
    } else if (key == "duplicate" || key == "dup") {
      ok = parse_probability(val, p.duplicate);
    } else if (key == "corrupt") {
      ok = parse_probability(val, p.corrupt);
    } else if (key == "rate") {
      ok = parse_rate_bps(val, p.rate_bps);
    } else if (key == "queue") {
      ok = parse_bytes(val, p.queue_bytes, queue_bdp);
    } else if (key == "ecn") {
      ok = parse_bytes(val, p.ecn_bytes, ecn_bdp);
    } else if (key == "seed") {
      char* end = nullptr;
      p.seed = std::strtoull(val.c_str(), &end, 10);
      ok = !val.empty() && *end == '\0';
    } else {
      error = "unknown key '" + key +
              "' (known: delay, jitter, dist, loss, burst, reorder, duplicate, corrupt, rate, "
              "queue, ecn, seed)";
      return false;
    }
    if (!ok) {
      error = "bad value in '" + it + "'";
      return false;
    }
  }
  if ((queue_bdp > 0 || ecn_bdp > 0) && (p.rate_bps == 0 || p.delay_ns == 0)) {
    error = "queue/ecn given in bdp need both rate and delay";
    return false;
  }
  if (queue_bdp > 0) p.queue_bytes = std::max<uint64_t>(1, std::llround(queue_bdp * bdp_bytes(p)));
  if (ecn_bdp > 0) p.ecn_bytes = std::max<uint64_t>(1, std::llround(ecn_bdp * bdp_bytes(p)));
  if ((p.queue_bytes || p.ecn_bytes) && p.rate_bps == 0) {
    error = "queue and ecn need a rate";
    return false;
  }
  out = p;
  return true;
}

}  // namespace softrdma::net
