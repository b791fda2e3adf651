// Small helpers shared by the Van's ZeroMQ sockets (net/zmq_router.h,
// net/zmq_dealer.h, net/van.h).
#ifndef PSTRAIN_NET_ZMQ_UTIL_H_
#define PSTRAIN_NET_ZMQ_UTIL_H_

#include <zmq.h>

#include <string>

namespace pstrain {

// The last ZeroMQ error of this thread, in words.
inline std::string ZmqError() { return zmq_strerror(zmq_errno()); }

// TCP keepalive on `socket`'s connections: a peer whose host vanished without
// closing (power lost, a cable pulled) is found dead after about two idle
// minutes (60 s, then 6 probes 10 s apart) and its connection released, where
// the kernel's default waits two hours before the first probe.
inline void SetTcpKeepalive(void* socket) {
  const int on = 1, idle_s = 60, interval_s = 10, probes = 6;
  zmq_setsockopt(socket, ZMQ_TCP_KEEPALIVE, &on, sizeof(on));
  zmq_setsockopt(socket, ZMQ_TCP_KEEPALIVE_IDLE, &idle_s, sizeof(idle_s));
  zmq_setsockopt(socket, ZMQ_TCP_KEEPALIVE_INTVL, &interval_s, sizeof(interval_s));
  zmq_setsockopt(socket, ZMQ_TCP_KEEPALIVE_CNT, &probes, sizeof(probes));
}

}  // namespace pstrain

#endif  // PSTRAIN_NET_ZMQ_UTIL_H_
