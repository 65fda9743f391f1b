#include "ccl/pipeline.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>

#include "ccl/reduce.h"

namespace softrdma::ccl::detail {

namespace {

// Chunks of a step of `elems` elements: an empty step still moves one (empty) chunk.
size_t step_chunks(size_t elems, size_t chunk_elems) {
  return elems == 0 ? 1 : (elems + chunk_elems - 1) / chunk_elems;
}

// Walks the (step, chunk) pairs of a step list in transfer-index order.
struct Cursor {
  size_t step = 0;
  size_t chunk = 0;
  size_t index = 0;
};

class PipelineRun {
 public:
  PipelineRun(Context& ctx, const Pipeline& p)
      : ctx_(ctx), p_(p), ts_(type_size(p.type)), ce_(ctx.chunk_elems(p.type)), depth_(1) {
    sp_ = prefix(p.sends.size(), [&](size_t s) { return p.sends[s].elems; });
    rp_ = prefix(p.recvs.size(), [&](size_t s) { return p.recvs[s].elems; });
    // The deeper of the two links' windows (Context::depth: Config::depth, or the path's
    // bandwidth-delay product in chunks), but never more than the transfers there are, so a
    // short pipeline over a long path does not take scratch slots it cannot fill.
    if (p.send_peer >= 0) depth_ = std::max(depth_, ctx.depth(p.send_peer));
    if (p.recv_peer >= 0) depth_ = std::max(depth_, ctx.depth(p.recv_peer));
    depth_ = std::min(depth_, std::max<size_t>({sp_.back(), rp_.back(), 1}));
    fwd_.assign(p.recvs.size(), -1);
    size_t max_forward = 0;
    bool slots = false;
    for (const PipelineRecv& r : p.recvs) slots |= r.mode != RecvMode::kDirect;
    for (size_t s = 0; s < p.sends.size(); ++s) {
      const PipelineSend& snd = p.sends[s];
      if (snd.after_recv < 0) {
        if (snd.from_slot) fail("send step " + std::to_string(s) + " from_slot without after_recv");
        continue;
      }
      const auto a = static_cast<size_t>(snd.after_recv);
      if (a >= p.recvs.size() || p.recvs[a].elems != snd.elems || sp_[s] < rp_[a])
        fail("send step " + std::to_string(s) + " depends on a later or mismatched recv step");
      if (snd.from_slot) {
        if (p.recvs[a].mode != RecvMode::kReduceForward || fwd_[a] >= 0)
          fail("send step " + std::to_string(s) + " forwards a slot that is not forwardable");
        fwd_[a] = static_cast<int>(s);
        max_forward = std::max(max_forward, sp_[s] - rp_[a]);
      }
    }
    for (size_t r = 0; r < p.recvs.size(); ++r) {
      const PipelineRecv& rcv = p.recvs[r];
      if (rcv.mode != RecvMode::kDirect && rcv.base == nullptr)
        fail("recv step " + std::to_string(r) + " reduces without a local operand");
      if (rcv.after_send < 0) continue;
      const auto a = static_cast<size_t>(rcv.after_send);
      if (a >= p.sends.size() || p.sends[a].elems != rcv.elems || sp_[a] >= rp_[r])
        fail("recv step " + std::to_string(r) + " waits for a later or mismatched send step");
    }
    if (slots) {
      // A slot is busy from its recv's post until it was processed and, when forwarded,
      // until the forwarding send completed: max_forward transfers later at most.
      nslots_ = depth_ + max_forward;
      slot_bytes_ = ce_ * ts_;
      slots_ = ctx_.scratch(nslots_ * slot_bytes_);
      release_.assign(nslots_, kNone);
    }
  }

  void run() {
    const size_t ns = sp_.back();
    const size_t nr = rp_.back();
    const size_t end = std::max(ns, nr);
    for (size_t t = 0; t < end; ++t) {
      post_ready(t + depth_);
      if (t < nr) {
        while (recv_.index <= t) post_recv(/*block=*/true);
      }
      while (t < ns && send_.index <= t && send_data_ready()) post_send(/*block=*/true);
      if (t < nr) {
        ctx_.wait(recvs_.front().id);
        process(recvs_.front());
        recvs_.pop_front();
      }
      while (t < ns && send_.index <= t) {
        if (!send_data_ready()) fail("send " + std::to_string(t) + " has no data at its turn");
        post_send(/*block=*/true);
      }
      reap_sends();
    }
    while (!sends_.empty()) wait_oldest_send();
  }

 private:
  static constexpr size_t kNone = ~size_t{0};

  struct PostedRecv {
    size_t index, step, chunk, slot;
    RequestId id;
  };
  struct PostedSend {
    size_t index;
    RequestId id;
  };

  [[noreturn]] static void fail(const std::string& what) {
    throw std::logic_error("pipeline: " + what);
  }

  template <class F>
  std::vector<size_t> prefix(size_t steps, F elems) const {
    std::vector<size_t> v(steps + 1, 0);
    for (size_t s = 0; s < steps; ++s) v[s + 1] = v[s] + chunks(elems(s));
    return v;
  }

  size_t chunks(size_t elems) const { return step_chunks(elems, ce_); }
  size_t chunk_bytes(size_t elems, size_t chunk) const {
    return elems == 0 ? 0 : std::min(ce_, elems - chunk * ce_) * ts_;
  }
  void advance(Cursor& c, size_t step_elems) const {
    ++c.index;
    if (++c.chunk == chunks(step_elems)) {
      c.chunk = 0;
      ++c.step;
    }
  }
  // Every send below this index has completed.
  size_t sends_done_below() const { return sends_.empty() ? send_.index : sends_.front().index; }

  bool send_data_ready() const {
    const PipelineSend& s = p_.sends[send_.step];
    return s.after_recv < 0 || rp_[static_cast<size_t>(s.after_recv)] + send_.chunk < processed_;
  }

  // Whether recv_ may be posted; with `block`, waits for the sends it waits for (all of
  // lower index than recv_, see pipeline.h) instead of answering false.
  bool recv_ready(bool block) {
    const PipelineRecv& r = p_.recvs[recv_.step];
    size_t need = kNone;  // a send index that must have completed
    if (r.after_send >= 0) need = sp_[static_cast<size_t>(r.after_send)] + recv_.chunk;
    if (nslots_ != 0) {
      const size_t slot = recv_.index % nslots_;
      if (recv_.index >= nslots_ && recv_.index - nslots_ >= processed_) {
        if (block) fail("recv slot still holds an unprocessed chunk at its turn");
        return false;
      }
      if (release_[slot] != kNone && (need == kNone || release_[slot] > need))
        need = release_[slot];
    }
    while (need != kNone && need >= sends_done_below()) {
      if (!block) return false;
      if (need >= send_.index) fail("recv waits for a send not yet posted");
      wait_oldest_send();
    }
    return true;
  }

  void post_recv(bool block) {
    if (!recv_ready(block)) return;
    const PipelineRecv& r = p_.recvs[recv_.step];
    const size_t bytes = chunk_bytes(r.elems, recv_.chunk);
    const size_t slot = nslots_ != 0 ? recv_.index % nslots_ : 0;
    const Region into = r.mode == RecvMode::kDirect ? r.dst.at(recv_.chunk * ce_ * ts_)
                                                    : slots_.at(slot * slot_bytes_);
    const RequestId id = ctx_.recv(p_.recv_peer, into, bytes, ctx_.tag(p_.phase, recv_.index));
    recvs_.push_back({recv_.index, recv_.step, recv_.chunk, slot, id});
    advance(recv_, r.elems);
  }

  void post_send(bool block) {
    while (sends_.size() >= depth_) {
      if (!block) return;
      wait_oldest_send();
    }
    const PipelineSend& s = p_.sends[send_.step];
    const size_t bytes = chunk_bytes(s.elems, send_.chunk);
    Region from;
    if (s.from_slot) {
      const size_t ri = rp_[static_cast<size_t>(s.after_recv)] + send_.chunk;
      from = slots_.at((ri % nslots_) * slot_bytes_);
    } else {
      from = s.src.at(send_.chunk * ce_ * ts_);
    }
    const RequestId id = ctx_.send(p_.send_peer, from, bytes, ctx_.tag(p_.phase, send_.index));
    sends_.push_back({send_.index, id});
    advance(send_, s.elems);
  }

  // Posts, without blocking, what is ready among the transfers below `limit`.
  void post_ready(size_t limit) {
    const size_t nr = std::min(rp_.back(), limit);
    while (recv_.index < nr) {
      const size_t before = recv_.index;
      post_recv(/*block=*/false);
      if (recv_.index == before) break;
    }
    const size_t ns = std::min(sp_.back(), limit);
    while (send_.index < ns && send_data_ready() && sends_.size() < depth_)
      post_send(/*block=*/false);
  }

  void wait_oldest_send() {
    ctx_.wait(sends_.front().id);
    sends_.pop_front();
  }

  void reap_sends() {
    while (!sends_.empty() && ctx_.test(sends_.front().id)) sends_.pop_front();
  }

  void process(const PostedRecv& pr) {
    const PipelineRecv& r = p_.recvs[pr.step];
    const size_t elems = chunk_bytes(r.elems, pr.chunk) / ts_;
    const size_t off = pr.chunk * ce_ * ts_;
    if (r.mode == RecvMode::kReduce) {
      char* out = r.dst.ptr + off;
      reduce_to(out, r.base + off, slots_.ptr + pr.slot * slot_bytes_, elems, p_.type, p_.op);
      if (r.scale) scale_avg(out, elems, p_.type, ctx_.size());
    } else if (r.mode == RecvMode::kReduceForward) {
      reduce_into(slots_.ptr + pr.slot * slot_bytes_, r.base + off, elems, p_.type, p_.op);
    }
    if (nslots_ != 0) {
      const int f = fwd_[pr.step];
      release_[pr.slot] = f < 0 ? kNone : sp_[static_cast<size_t>(f)] + pr.chunk;
    }
    ++processed_;
  }

  Context& ctx_;
  const Pipeline& p_;
  size_t ts_;
  size_t ce_;
  size_t depth_;
  std::vector<size_t> sp_;  // sp_[s]: index of the first transfer of send step s
  std::vector<size_t> rp_;  // rp_[s]: index of the first transfer of recv step s
  std::vector<int> fwd_;    // fwd_[r]: send step forwarding recv step r's slot, or -1
  size_t nslots_ = 0;
  size_t slot_bytes_ = 0;
  Region slots_;
  std::vector<size_t> release_;  // per slot: send index that must complete before reuse
  Cursor send_;
  Cursor recv_;
  size_t processed_ = 0;  // recvs below this index are processed
  std::deque<PostedSend> sends_;
  std::deque<PostedRecv> recvs_;
};

}  // namespace

void run_pipeline(Context& ctx, const Pipeline& p) {
  PipelineRun(ctx, p).run();
}

}  // namespace softrdma::ccl::detail
