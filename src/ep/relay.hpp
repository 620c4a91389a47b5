// Cross-host dispatch and combine through relay ranks (DeepEP-style hierarchy).
//
// A token crosses the network once per destination host: the source packs, per remote host, the
// tokens with at least one expert there and sends that one message to its relay on that host,
// relay_of(source, host) = the host's rank with the source's local index (modulo the host's size:
// "rail-aligned", so with equal hosts every rank relays for the same number of sources and the
// relays' load is balanced). The relay acts as a proxy for the source inside its host: it writes
// the source's count records and rows into the local ranks' windows with the shared-memory
// data-as-flag protocol, so receivers cannot tell relayed rows from local ones.
// Combine mirrors it: for each remote owner it relays for, the relay reads the rows of that
// owner's tokens in place from its host's ranks, reduces them into one fp32 partial per token
// (ascending rank, or ascending k), and sends the partials back in one message. Owners add the
// per-host partials in ascending host order, so results are bit-identical to every other
// implementation of the same order (DESIGN §2, generalised to hosts: see reduce_token).
//
// progress() never blocks: it tests pending messages and does whatever relay work has its inputs
// ready. Every wait of the algorithms calls it (through the caller's thread, the only one that
// touches the transport), which is what makes the waits deadlock-free: count records of remote
// sources appear as soon as their message arrives, whoever is waiting for them.
#pragma once

#include <cstdint>
#include <vector>

#include "ep/dispatch_call.hpp"
#include "ep/window.hpp"
#include "transport/remote.hpp"
#include "ubep/buffer.hpp"

namespace ubep {

class HostRelay {
 public:
  // The relay writes relayed rows with the same placement (DispatchCall::place_row) as local
  // senders; it serves one call at a time, the one handed to start_dispatch.
  HostRelay(Group& g, const BufferConfig& cfg, ep::Window& win);
  // Abandons the receives and sends a failed call left pending (Remote::abandon): they must not
  // outlive their buffers where the transport outlives a lost host (TcpRemote keeps serving the
  // other peers, and a send queued to a cut peer would be written from freed memory).
  ~HostRelay();
  HostRelay(const HostRelay&) = delete;
  HostRelay& operator=(const HostRelay&) = delete;

  int my_host() const { return my_host_; }
  int num_hosts() const { return static_cast<int>(hosts_.size()); }
  const std::vector<int>& host_ranks(int h) const { return hosts_[static_cast<size_t>(h)]; }
  bool local(int r) const;

  // Dispatch: post receives from the sources this rank relays for, pack and send this rank's
  // tokens to its relays on the other hosts.
  void start_dispatch(const ep::DispatchCall& call);
  // Non-blocking relay work; true once every relayed message was forwarded and every send done.
  bool progress();
  // All relayed messages have arrived and their count records are written (bsp's stage 1).
  bool counts_forwarded() const;

  // Combine: post the receives for the partials of this rank's tokens from remote hosts.
  void start_combine(const ep::DispatchCall& call);
  // The fp32 partial of token t computed on host h (nullptr if the token has no expert there).
  // Only valid once combine_partial_arrived(h).
  const float* partial(int h, int64_t t) const;
  bool combine_partial_arrived(int h);
  bool combine_done();

  // A call ended without finishing (abandoned when the group changed, docs/ELASTIC.md): its
  // receives and sends are withdrawn (Remote::abandon), so none of them can take or give a
  // later call's message.
  void abandon_call();

  uint64_t network_bytes() const { return sent_bytes_; }
  uint64_t network_rows() const { return sent_rows_; }

 private:
  struct Relayed {  // a source this rank relays for
    int source = 0;
    int request = -1;        // pending receive, -1 once arrived
    bool counted = false;    // count records written
    bool forwarded = false;  // rows placed
    bool partial_sent = false;
    std::vector<char> msg[2];           // by call parity
    std::vector<int64_t> row_off;       // [R] offset of the source's rows at each local rank
    std::vector<int64_t> expert_off;    // [R, El]
    std::vector<float> partial;         // [T, H] combine partials for the source
    int cursor = 0;                     // next token to reduce
    std::vector<int64_t> rows_seen;     // [R] rows of the source consumed per local rank so far
    std::vector<int64_t> experts_seen;  // [R*El] rows consumed per expert so far
  };

  size_t record_bytes() const;
  // Host h takes no part in the call: every rank of it is masked (across hosts whole hosts are
  // masked, docs/ELASTIC.md): nothing is sent to it nor awaited from it.
  bool host_masked(size_t h) const;
  // The call's transport tags: the dispatch sequence number is in them, so a message of an
  // earlier call (abandoned when the group changed) can never be taken for this call's; those
  // left unmatched are dropped at the next dispatch (Remote::drop_unexpected). The arithmetic:
  // protocol.hpp relay_wire.
  int dispatch_tag() const { return protocol::relay_wire::dispatch_tag(seq_); }
  int combine_tag() const { return protocol::relay_wire::combine_tag(seq_); }
  void pack();  // this rank's rows, from the call's rows()
  void write_counts(Relayed& s);
  bool lower_counts_ready(const Relayed& s, int dest) const;
  void forward(Relayed& s);
  void advance_partials(Relayed& s);
  template <typename Visit>
  void walk(const Relayed& s, Visit&& visit) const;

  Group& g_;
  const BufferConfig& cfg_;
  ep::Window& win_;
  // The call being relayed: from start_dispatch until the next one (its combine included).
  const ep::DispatchCall* call_ = nullptr;
  transport::Remote* remote_;
  int local_experts_;
  int64_t max_tokens_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> local_index_;
  int my_host_ = 0;
  std::vector<Relayed> relayed_;
  std::vector<std::vector<char>> out_;          // [hosts] packed tokens to each remote host
  std::vector<int> out_req_;                    // pending sends (dispatch and combine)
  std::vector<std::vector<float>> in_partial_;  // [hosts] partials for my tokens
  std::vector<int> in_partial_req_;             // -1 once arrived
  std::vector<int32_t> host_slot_;  // [T, hosts] index of my token in the message to host h
  std::vector<int64_t> scratch_rows_, scratch_expert_;
  std::vector<int32_t> count_rows_, count_experts_;
  std::vector<const void*> gather_rows_;
  std::vector<float> gather_weights_;
  std::vector<int64_t> gather_slots_;
  uint64_t sent_bytes_ = 0, sent_rows_ = 0;
  bool in_combine_ = false;
  uint64_t seq_ = 0;  // the dispatch sequence number of the call (in its tags)
};

}  // namespace ubep
