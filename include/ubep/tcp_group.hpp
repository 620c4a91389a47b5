// Ranks as processes on several hosts with one launcher per host and no MPI job spanning hosts
// (issue 32; docs/ELASTIC.md, "Transport for a lost host"). Every host starts its own ranks (fork,
// or a per-host mpirun -np R on that host only); they meet through a TCP rendezvous that the
// first rank of host 0 serves. Ranks of one host share memory as in make_bootstrap_group; ranks
// of different hosts exchange tokens over TCP sockets of their own. A lost host then fails only
// the requests to its ranks, with a named error: the processes on the other hosts live on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ubep/group.hpp"

namespace ubep {

struct TcpLaunch {
  std::string rendezvous;  // "IPv4:port" where host 0's local rank 0 listens for the others
  int hosts = 1;           // how many hosts (launchers)
  int host = 0;            // this launcher's host, 0..hosts-1
  int ranks_per_host = 1;  // ranks every launcher starts
  int local_rank = 0;      // this process among its host's ranks, 0..ranks_per_host-1
  // A replacement host (issue 32): this launcher's ranks take the place of host `host`'s lost
  // ranks in a live group whose survivors masked it (BufferConfig::mask_dead_ranks); they create
  // the same Buffers and are served again from their first dispatch (docs/ELASTIC.md). Host 0
  // too, once the other hosts went on without it (3 hosts or more: the partition rule). Its
  // Buffers made before its first group barrier or allgather mirror the live ranks' (no
  // collective); Buffers made after it are made by every rank together. From UBEP_REJOIN=1.
  bool rejoin = false;
  // The live side of that: every host's local rank 0 keeps a door open for replacement hosts
  // while the group lives, at its host's address and door port (door_ports, else the
  // rendezvous' port + host index);
  // host 0's is the rendezvous itself. Those ports stay taken: a later group needs another
  // rendezvous port. From UBEP_ELASTIC=1.
  bool elastic = false;
  // Each host's IPv4, in host order (optional). A replacement asks the lowest live host's door
  // for the group; without these it knows only host 0's (the rendezvous), or every host's when
  // the rendezvous is on loopback, so a replacement of host 0 on real hosts needs them. When
  // empty, a replacement reads them from UBEP_HOST_IPS="ip0,ip1,...".
  std::vector<std::string> host_ips;
  // Each host's door port, in host order (optional; host 0's entry is 0 or the rendezvous'
  // port, its door being the rendezvous): else the rendezvous' port + host index. Launchers on
  // one machine whose rendezvous port came from a free-port probe pass probed ports here, so a
  // door never meets another socket's port. Every launcher, replacements included, passes the
  // same; when empty, read from UBEP_DOOR_PORTS="p0,p1,...".
  std::vector<int> door_ports;
  int rank() const { return host * ranks_per_host + local_rank; }

  // From the environment a launcher sets for its ranks: UBEP_RENDEZVOUS=ip:port, UBEP_HOSTS,
  // UBEP_HOST_INDEX, UBEP_RANKS_PER_HOST, UBEP_REJOIN, UBEP_ELASTIC; the local rank
  // from UBEP_LOCAL_RANK when local_rank is -1. Throws InvalidArgument naming a missing or
  // malformed variable.
  static TcpLaunch from_env(int local_rank = -1);
};

// Collective over every rank of every host. Throws InvalidArgument on a bad launch, TimeoutError
// when a rank does not arrive within options.timeout, SystemError when a socket cannot be made.
std::unique_ptr<Group> make_tcp_group(const TcpLaunch& launch, GroupOptions options = {});

}  // namespace ubep
