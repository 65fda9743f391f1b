// Wide-area topology for the link emulator: sites (sets of device IPv4 addresses) and the
// links between them, each direction with its own LinkParams. Traffic inside a site, and
// between sites without a link, is not shaped.
//
// File format (one statement per line; '#' starts a comment):
//   site NAME ADDR...          ADDR: 127.0.0.1, a range 127.0.0.1-127.0.0.8, or a CIDR
//                              block 127.0.1.0/24; a site may span several lines
//   link A B PARAMS...         the direction A → B (PARAMS as parse_link_params)
//   link A <-> B PARAMS...     both directions with the same parameters
// e.g. two data centres 1,500 km apart (≈ 7.5 ms one way in fibre), 10 Gbit/s:
//   site guizhou  127.0.0.1-127.0.0.2
//   site shanghai 127.0.0.3-127.0.0.4
//   link guizhou <-> shanghai delay=7.5ms jitter=100us rate=10gbit queue=1bdp loss=0.01%
// The one-line form (no "site"/"link" keywords, just PARAMS) shapes every packet between two
// different addresses, both directions alike: the two-endpoint case.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "net/link_params.h"

namespace softrdma::net {

/// Parsed topology (see the file comment).
struct WanTopology {
  struct Range {
    uint32_t first, last;  ///< IPv4, host order, inclusive
  };
  struct Site {
    std::string name;
    std::vector<Range> ranges;
  };
  struct Link {
    int from, to;  ///< site indices; from == to == −1: the one-line form (any two addresses)
    LinkParams params;
  };
  std::vector<Site> sites;
  std::vector<Link> links;

  /// Whether this is the one-line form: one link, between any two different addresses, each
  /// direction alike (its rate is each sender's: WanShaper keys its clock by the sender).
  bool one_line() const { return links.size() == 1 && links[0].from < 0; }
  /// Index of the site holding `ip` (host order), or −1.
  int site_of(uint32_t ip) const;
  /// The link a packet from `src` to `dst` (host order) crosses, or null when it stays
  /// inside a site or no link joins the two sites.
  const Link* link_for(uint32_t src, uint32_t dst) const;
  /// Index of `l` in links (a stable id for per-link state).
  size_t index_of(const Link* l) const { return static_cast<size_t>(l - links.data()); }
  /// The fastest rate, bits/s, of the links a packet from `ip` (host order) can leave on: the
  /// one-line form's link, or the links from ip's site. 0 when no link leaves it or one that
  /// does has no rate (unlimited) — what a port facing these links would be sized for.
  uint64_t egress_rate_bps(uint32_t ip) const;
};

/// Parses the topology text `text` (file contents, or a one-line PARAMS spec). Returns false
/// and sets `error` to "line N: …" on an unknown statement, an unknown or duplicate site
/// name, an address in two sites, a duplicate link direction or bad parameters.
bool parse_wan_topology(const std::string& text, WanTopology& out, std::string& error);

/// Reads and parses the file at `path`; errors as parse_wan_topology, or "cannot read PATH:
/// reason".
bool load_wan_topology(const std::string& path, WanTopology& out, std::string& error);

/// A SOFTRDMA_WAN / `--wan` value: the topology file of that name when a regular file has
/// it, else one line of link parameters. Sets `out` and `text` (the file's contents or the
/// value itself); errors as load_wan_topology / parse_wan_topology.
bool read_wan_spec(const std::string& value, WanTopology& out, std::string& text,
                   std::string& error);

}  // namespace softrdma::net
