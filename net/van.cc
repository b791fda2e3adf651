#include "net/van.h"

#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "net/doorbell.h"
#include "net/shm_placement.h"
#include "net/shm_sequence.h"
#include "net/zmq_router.h"
#include "net/zmq_util.h"

namespace pstrain {
namespace {

// Data messages whose keys, lens and (not shared-memory) values fit in this
// many bytes cross ZeroMQ as one frame (a batch, kBatchMagic, of one or
// more): one copy of them costs less than three more frames through ZeroMQ
// on both ends.
constexpr uint64_t kPackBytes = 32 * 1024;
// A batch frame stops growing past this many bytes of keys, lens and values.
constexpr uint64_t kMaxBatchBytes = 4 << 20;

// Bytes a data message carries besides its header: keys, lens and (with
// `values`) its values.
uint64_t PayloadBytes(const Message& msg, bool values) {
  uint64_t bytes = msg.keys.size() + msg.lens.size();
  if (values) {
    for (const Blob& v : msg.values) bytes += v.size();
  }
  return bytes;
}

// At least what a batchable message (CMD_DATA) adds to its payload in a
// batch frame (length, header length, header, padding), without serializing
// its header twice: the header's numeric fields take under 128 bytes, an
// error reply's message its length (and a few), the push rounds at most 12
// bytes per key, 1.5x the keys frame's 8. Shared-memory fields are not there
// (such messages go one by one).
uint64_t EnvelopeBound(const Message& msg) {
  return 160 + msg.header.error_message().size() + msg.keys.size() * 3 / 2;
}

}  // namespace

// One connection: its DEALER, and what makes messages to a co-located peer
// go through shared memory in order.
struct Van::Peer {
  Peer(std::unique_ptr<ZmqDealer> dealer, ConnectionEvents* events,
       std::shared_ptr<ShmMapping> theirs, DoorbellAddress doorbell,
       std::shared_ptr<ShmArena> arena, int id, uint8_t incarnation)
      : dealer(std::move(dealer)),
        events(events),
        theirs(std::move(theirs)),
        doorbell(doorbell),
        arena(std::move(arena)),
        id(id),
        incarnation(incarnation) {}
  // Once nothing sends to it any more (the connection closed or replaced, the
  // Van gone): every block of our arena this process of the peer still holds
  // is taken back, so a peer that died reading does not stall our ring.
  ~Peer() {
    if (arena != nullptr) arena->ReleaseReceiver(id, incarnation);
  }

  Mutex mu;  // serializes sends to this peer: numbers are taken in send order
  const std::unique_ptr<ZmqDealer> dealer PT_GUARDED_BY(mu);
  ConnectionEvents* const events;            // the dealer's (thread-safe): read without mu
  const std::shared_ptr<ShmMapping> theirs;  // the peer's arena, mapped here (null: TCP)
  std::atomic<bool> maps_mine{false};        // the peer said it mapped our arena
  ShmSequence sequence GUARDED_BY(mu);       // shm_seq of messages to it (with theirs)
  DoorbellAddress doorbell GUARDED_BY(mu);   // invalid: messages to it go over ZeroMQ
  // Our arena (null: none), the node id our tickets for it are under (its id
  // when connected; Rename does not move them) and this process's incarnation
  // of that id (ShmArena::Ticket).
  const std::shared_ptr<ShmArena> arena;
  const int id;
  const uint8_t incarnation;
};

Van::Van(const VanOptions& options, Handler handler)
    : options_(options), handler_(std::move(handler)), order_(options.name, options.verbose) {}

StatusOr<std::unique_ptr<Van>> Van::Create(const VanOptions& options, Handler handler) {
  std::unique_ptr<Van> van(new Van(options, std::move(handler)));
  van->context_ = zmq_ctx_new();
  if (van->context_ == nullptr) return Status::IOError("zmq_ctx_new: " + ZmqError());
  // Three sockets per peer (its DEALER, libzmq's monitor of it, our end of
  // that monitor) past ZeroMQ's default of 1023 per context: a scheduler of
  // a job of more than about 340 nodes could not connect to every node.
  const int socket_limit = zmq_ctx_get(van->context_, ZMQ_SOCKET_LIMIT);
  if (zmq_ctx_set(van->context_, ZMQ_MAX_SOCKETS, std::min(std::max(socket_limit, 1023), 65535)) !=
      0) {
    LOG(WARNING) << options.name << ": ZeroMQ keeps its default of 1023 sockets (" << ZmqError()
                 << "): a job of over about 340 nodes cannot start";
  }
  RouterOptions ro;
  ro.bind_host = options.bind_host;
  ro.port = options.port;
  ro.max_message_bytes = options.max_message_bytes;
  ro.keys = options.keys;
  ro.encrypt = options.encrypt;
  ro.name = options.name;
  ASSIGN_OR_RETURN(van->router_, ZmqRouter::Bind(van->context_, ro));
  van->port_ = van->router_->port();
  if (options.shm_bytes > 0) {
    auto arena = ShmArena::Create(options.shm_bytes, options.shm_store_bytes);
    if (arena.ok()) {
      van->arena_ = std::move(arena).value();
      van->placement_ = std::make_unique<ShmPlacement>(van->arena_.get(), options.shm_min_bytes);
      van->shm_info_ = van->arena_->info();
      // Named after the arena's token: peers on this host (and network
      // namespace) write a byte to it to wake ReceiveLoop.
      auto bell = Doorbell::Open(StrCat("pstrain-", getpid(), "-", van->shm_info_.token()));
      if (bell.ok()) {
        van->doorbell_ = std::move(bell).value();
        van->shm_info_.set_doorbell(van->doorbell_->name());
      } else {
        LOG(WARNING) << options.name << ": no doorbell socket (" << bell.status().message()
                     << "); co-located peers send messages over TCP";
      }
    } else {
      LOG(WARNING) << options.name
                   << ": no shared-memory arena, co-located peers use TCP: " << arena.status();
    }
  }
  return van;
}

void Van::StartReceiving() {
  CHECK(!receiver_.joinable()) << "StartReceiving called twice";
  receiver_ = std::thread([this] { ReceiveLoop(); });
}

void Van::StopReceiving() {
  stop_ = true;
  if (!receiver_.joinable()) return;
  receiver_.join();
  event_drainer_ = std::thread([this] { DrainEventsLoop(); });
}

void Van::DrainEventsLoop() {
  // As often as the receive thread read them (ReceiveLoop).
  constexpr auto kEventsEvery = std::chrono::milliseconds(250);
  MutexLock l(&drainer_mu_);
  while (!drainer_stop_) {
    DrainConnectionEvents();
    drainer_cv_.WaitUntil(Deadline::In(kEventsEvery),
                          [this]() REQUIRES(drainer_mu_) { return drainer_stop_; });
  }
}

Van::~Van() {
  stop_ = true;  // (StopReceiving would start the drainer)
  if (receiver_.joinable()) receiver_.join();
  if (event_drainer_.joinable()) {
    {
      MutexLock l(&drainer_mu_);
      drainer_stop_ = true;
      drainer_cv_.SignalAll();
    }
    event_drainer_.join();
  }
  {
    MutexLock l(&mu_);
    peers_.clear();
  }
  router_.reset();
  if (context_ != nullptr) zmq_ctx_term(context_);
  doorbell_.reset();
}

const ShmInfo* Van::shm_info() const { return arena_ != nullptr ? &shm_info_ : nullptr; }

int64_t Van::refused() const { return router_ != nullptr ? router_->refused() : 0; }

int64_t Van::shm_fallbacks() const { return placement_ != nullptr ? placement_->fallbacks() : 0; }

void Van::SetSelfId(int id) { self_id_ = id; }

void Van::ExpectRoute(int id, const std::string& route) {
  MutexLock l(&mu_);
  routes_[id] = route;
}

bool Van::PeerMapsOurArena(int id) {
  MutexLock l(&mu_);
  auto it = peers_.find(id);
  return it != peers_.end() && it->second->maps_mine.load();
}

Status Van::Connect(int id, const std::string& host, int port, const ShmInfo* shm) {
  ASSIGN_OR_RETURN(std::string ip, ResolveHost(host));
  std::shared_ptr<ShmMapping> theirs;
  DoorbellAddress bell;
  if (shm != nullptr && options_.shm_bytes > 0) {
    auto mapped = ShmMapping::Open(*shm);
    if (mapped.ok()) {
      theirs = std::move(mapped).value();
      if (doorbell_ != nullptr && doorbell_->can_ring())
        bell = DoorbellAddress::Of(shm->doorbell());
    } else if (options_.verbose >= 1) {
      LOG(INFO) << options_.name << ": " << NodeIdName(id) << " at " << JoinHostPort(host, port)
                << " over TCP only: " << mapped.status();
    }
  }
  DealerOptions dopt;
  dopt.send_timeout_ms = options_.send_timeout_ms;
  dopt.routing_id = options_.routing_id;
  dopt.keys = options_.keys;
  dopt.encrypt = options_.encrypt;
  dopt.name = options_.name;
  dopt.reconnect_interval_ms = options_.reconnect_interval_ms;
  ASSIGN_OR_RETURN(std::unique_ptr<ZmqDealer> dealer, ZmqDealer::Open(context_, dopt));
  Status connected = dealer->Connect(StrCat("tcp://", JoinHostPort(ip, port)));
  if (!connected.ok()) {
    return Status::IOError(StrCat(options_.name, ": cannot connect to ", NodeIdName(id), " at ",
                                  JoinHostPort(host, port), ": ", connected.message()));
  }
  if (options_.verbose >= 1) {
    LOG(INFO) << options_.name << ": connected to " << NodeIdName(id) << " at "
              << JoinHostPort(host, port)
              << (theirs != nullptr ? " (its shared memory mapped)" : "");
  }
  ConnectionEvents* events = dealer->events();
  std::shared_ptr<Peer> old;  // a replaced peer's, let go after mu_
  MutexLock l(&mu_);
  // The queue read for `id` is the new process's, or none (an old process's
  // arena is neither read nor kept mapped once it is replaced).
  if (theirs != nullptr) {
    inbox_.Add(id, theirs);
  } else {
    inbox_.Remove(id);
  }
  // A new process under an id we sent to before (a replaced or reconnected
  // peer): what was queued for the old one is not for it. The old one's
  // blocks come back when its Peer goes.
  auto [incarnation, first] = incarnations_.try_emplace(id, 0);
  if (!first) {
    // A send to the old process under way can no longer queue anything.
    ++incarnation->second;
    if (arena_ != nullptr) arena_->ResetQueue(id, incarnation->second);
  }
  auto peer = std::make_shared<Peer>(std::move(dealer), events, theirs, bell, arena_, id,
                                     incarnation->second);
  std::shared_ptr<Peer>& slot = peers_[id];
  old = std::move(slot);
  slot = std::move(peer);
  return Status::Ok();
}

ConnectionReport Van::DescribeConnection(int id) {
  std::shared_ptr<Peer> peer = FindPeer(id);
  if (peer == nullptr)
    return {ConnectionReport::kNone, "no connection: none was opened, or it was closed"};
  // Not under peer->mu: a send blocked towards a gone peer holds it.
  return peer->events->Report();
}

void Van::DrainConnectionEvents() {
  std::vector<std::shared_ptr<Peer>> peers;
  {
    MutexLock l(&mu_);
    peers.reserve(peers_.size());
    for (const auto& [id, peer] : peers_) peers.push_back(peer);
  }
  for (const std::shared_ptr<Peer>& peer : peers) peer->events->Drain();
}

void Van::Rename(int from, int to) {
  MutexLock l(&mu_);
  auto it = peers_.find(from);
  if (it == peers_.end()) return;
  std::shared_ptr<Peer> peer = std::move(it->second);
  peers_.erase(it);
  peers_[to] = std::move(peer);
}

void Van::Disconnect(int id) {
  std::shared_ptr<Peer> old;
  MutexLock l(&mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  old = std::move(it->second);
  peers_.erase(it);
  // Its queue is no longer read; its arena is unmapped once the values read
  // from it are gone.
  if (old->theirs != nullptr) inbox_.Remove(id);
}

std::shared_ptr<Van::Peer> Van::FindPeer(int id) {
  MutexLock l(&mu_);
  auto it = peers_.find(id);
  return it != peers_.end() ? it->second : nullptr;
}

bool Van::IsBatchable(const Message& msg) {
  return msg.header.cmd() == CMD_DATA && PayloadBytes(msg, true) <= kPackBytes;
}

Status Van::SendBatch(int id, const std::vector<const Message*>& msgs, size_t* sent) {
  size_t dummy = 0;
  if (sent == nullptr) sent = &dummy;
  *sent = 0;
  std::shared_ptr<Peer> peer = FindPeer(id);
  if (peer == nullptr) {
    return Status::Unavailable(StrCat(options_.name, ": no connection to ", NodeIdName(id)));
  }
  // One by one where shared memory is in play (numbered messages, values in
  // the arena, the peer's queue): cheaper than a copy into a frame.
  const bool one_by_one = peer->theirs != nullptr || (arena_ != nullptr && peer->maps_mine);
  // A batch is one frame: within what the peer's ZeroMQ takes, envelopes
  // (length, header, padding) counted.
  const uint64_t cap =
      std::min<uint64_t>(kMaxBatchBytes, static_cast<uint64_t>(options_.max_message_bytes));
  for (size_t i = 0; i < msgs.size();) {
    size_t end = i;
    uint64_t bytes = 16;  // the batch frame's magic and count
    while (!one_by_one && end < msgs.size() && end - i < kMaxBatch && IsBatchable(*msgs[end])) {
      const uint64_t more = PayloadBytes(*msgs[end], true) + EnvelopeBound(*msgs[end]);
      if (bytes + more > cap) break;
      bytes += more;
      ++end;
    }
    if (end - i < 2) {
      RETURN_IF_ERROR(Send(id, *msgs[i]));
      *sent = ++i;
      continue;
    }
    RETURN_IF_ERROR(SendFrameOf(id, *peer, msgs, i, end));
    *sent = i = end;
  }
  return Status::Ok();
}

Status Van::SendFrameOf(int id, Peer& peer, const std::vector<const Message*>& msgs, size_t begin,
                        size_t end) {
  const size_t n = end - begin;
  std::vector<BatchEntry> items(n);
  for (size_t i = 0; i < n; ++i) {
    const Message& msg = *msgs[begin + i];
    items[i].msg = &msg;
    items[i].inline_values = !msg.values.empty();
    msg.header.SerializeToString(&items[i].header);
    if (msg.values.size() > 1) {
      PsHeader one;  // the values travel inline, as one frame
      one.set_num_value_frames(1);
      items[i].header += one.SerializeAsString();
    }
    if (options_.verbose >= 2) {
      LOG(INFO) << options_.name << " -> " << NodeIdName(id) << ": "
                << msg.header.ShortDebugString() << " (batch of " << n << ")";
    }
  }
  MutexLock l(&peer.mu);
  if (!peer.dealer->SendBatchFrame(items)) {
    return SendFailed(id, peer, /*ordered=*/false, nullptr);
  }
  batched_ += static_cast<int64_t>(n);
  ++batch_frames_;
  return Status::Ok();
}

Status Van::Send(int id, const Message& msg) {
  std::shared_ptr<Peer> peer = FindPeer(id);
  if (peer == nullptr) {
    return Status::Unavailable(StrCat(options_.name, ": no connection to ", NodeIdName(id)));
  }
  std::string header;
  msg.header.SerializeToString(&header);
  const bool data = msg.header.cmd() == CMD_DATA;
  // Shared-memory fields ride along as a second serialized PsHeader: protobuf
  // merges concatenated messages, so the caller's header is not copied.
  PsHeader extra;
  const bool ordered = peer->theirs != nullptr;
  if (ordered) extra.set_shm_mapped(true);
  // A renamed peer (the scheduler's, before its node table) gets no shared
  // memory: our tickets for it would be in the table of the id it had.
  const bool mine_mapped = placement_ != nullptr && peer->maps_mine.load() && peer->id == id;
  const bool in_shm = data && !msg.values.empty() && mine_mapped &&
                      placement_->Place(msg, peer->id, peer->incarnation, &extra);
  if (options_.verbose >= 2) {
    LOG(INFO) << options_.name << " -> " << NodeIdName(id) << ": " << msg.header.ShortDebugString()
              << (in_shm ? " (values in shared memory)" : "");
  }
  MutexLock l(&peer->mu);
  // Numbered under the peer's lock: the receiver restores this order whichever
  // way (queue or ZeroMQ) each message goes.
  if (ordered) peer->sequence.Stamp(&extra);
  if (ordered && mine_mapped && peer->doorbell.valid()) {
    // Values not placed in shared memory travel inside the queued message, as
    // one frame.
    const bool inline_values = data && !msg.values.empty() && !in_shm;
    PsHeader queued = extra;
    if (inline_values) queued.set_num_value_frames(1);
    if (SendThroughQueue(id, *peer, header + queued.SerializeAsString(), msg, inline_values)) {
      ++shm_queued_;
      if (in_shm) ++shm_sent_;
      return Status::Ok();
    }
  }
  if (data && PayloadBytes(msg, !in_shm) <= kPackBytes) {
    // One frame, a batch of one: the envelope, values inline.
    const bool inline_values = !msg.values.empty() && !in_shm;
    if (inline_values) extra.set_num_value_frames(1);
    if (!peer->dealer->SendBatchFrame(
            {{header + extra.SerializeAsString(), &msg, inline_values}})) {
      return SendFailed(id, *peer, ordered, in_shm ? &extra : nullptr);
    }
    if (in_shm) ++shm_sent_;
    return Status::Ok();
  }
  if (extra.ByteSizeLong() > 0) header += extra.SerializeAsString();
  if (!peer->dealer->SendFrames(header, data ? &msg : nullptr, /*values=*/!in_shm)) {
    return SendFailed(id, *peer, ordered, in_shm ? &extra : nullptr);
  }
  if (in_shm) ++shm_sent_;
  return Status::Ok();
}

Status Van::SendFailed(int id, Peer& peer, bool ordered, const PsHeader* placed) {
  peer.mu.AssertHeld();
  const std::string error = ZmqError();
  // Nothing left: the number goes to the next message (still under peer.mu).
  if (ordered) peer.sequence.Rollback();
  if (placed != nullptr) placement_->Release(*placed, peer.id);
  return Status::Unavailable(StrCat(options_.name, ": send to ", NodeIdName(id), " at ",
                                    peer.dealer->address(), " failed: ", error));
}

bool Van::SendThroughQueue(int id, Peer& peer, const std::string& header, const Message& msg,
                           bool inline_values) {
  peer.mu.AssertHeld();
  if (!EnqueueMessage(arena_.get(), peer.id, peer.incarnation, header, msg, inline_values)) {
    return false;
  }
  if (peer.theirs->PeerSleeping()) {
    ++doorbells_rung_;
    Status rung = doorbell_->Ring(peer.doorbell);
    if (!rung.ok()) {
      // Not reachable (another network namespace): the entry is read at the
      // receiver's next wake-up; later messages go over ZeroMQ, still in order.
      LOG(WARNING) << options_.name << ": doorbell of " << NodeIdName(id) << " failed ("
                   << rung.message() << "); sending to it over TCP from now on";
      peer.doorbell.Clear();
    }
  }
  return true;
}

void Van::ReceiveLoop() {
  const int bell = doorbell_ != nullptr ? doorbell_->fd() : -1;
  zmq_pollitem_t items[2] = {{router_->socket(), 0, ZMQ_POLLIN, 0}, {nullptr, bell, ZMQ_POLLIN, 0}};
  const int num_items = bell >= 0 ? 2 : 1;
  // Every connection's events are read a few times a second: unread, they
  // would stop ZeroMQ's I/O thread (ConnectionEvents).
  constexpr auto kEventsEvery = std::chrono::milliseconds(250);
  auto events_due = std::chrono::steady_clock::now() + kEventsEvery;
  while (!stop_.load()) {
    if (const auto now = std::chrono::steady_clock::now(); now >= events_due) {
      DrainConnectionEvents();
      events_due = now + kEventsEvery;
    }
    const ShmInbox::Entries& inbound = inbox_.Current();
    const int me = self_id_.load();
    bool busy = false;
    for (const auto& [peer, mapping] : inbound) busy |= DrainQueue(peer, *mapping, me);
    // Drain ZeroMQ, but look at stop_ now and then.
    for (int i = 0; i < 1024 && !stop_.load(); ++i) {
      if (!ReceiveOne()) break;
      busy = true;
    }
    // Nothing came this pass, so a number still missing is not merely unread:
    // those missing too long are given up, and what waited behind them goes on.
    busy = busy || order_.SkipOverdue(std::chrono::steady_clock::now(),
                                      std::chrono::milliseconds(options_.order_gap_timeout_ms),
                                      handler_) > 0;
    if (busy && burst_end_) burst_end_();
    if (busy) continue;
    // Nothing waiting: say so (peers that enqueue now ring the doorbell), look
    // once more, then sleep.
    if (arena_ != nullptr) arena_->SetSleeping(true);
    bool pending = false;
    for (const auto& [peer, mapping] : inbound) {
      pending |= !order_.Paused(peer) && !mapping->QueueEmpty(me);
    }
    if (!pending) zmq_poll(items, num_items, 100);
    if (arena_ != nullptr) arena_->SetSleeping(false);
    if (doorbell_ != nullptr) doorbell_->Drain();
  }
}

bool Van::DrainQueue(int peer, ShmMapping& mapping, int me) {
  // The queue is first in, first out: while many of this peer's messages wait
  // for an earlier number, that one is on ZeroMQ, so stop reading the queue.
  if (order_.Paused(peer)) return false;
  bool any = false;
  for (int i = 0; i < 256 && !stop_.load(); ++i) {
    Decoded d;
    const QueueRead read = ReadQueued(mapping, peer, me, &d);
    if (read == QueueRead::kEmpty) break;
    any = true;
    if (read == QueueRead::kBad) {
      Drop(d.header_ok ? &d.msg : nullptr, d.error, peer);
      continue;
    }
    Finish(std::move(d.msg));
  }
  return any;
}

void Van::Drop(const Message* msg, const std::string& why, int queue_owner) {
  ++dropped_;
  LOG(WARNING) << options_.name << ": dropped a malformed message"
               << (msg != nullptr ? " said to come from " + NodeIdName(msg->header.sender()) : "")
               << ": " << why;
  if (msg == nullptr) return;
  // A forged sender must not skip another node's numbers (holding up or
  // refusing its real messages) nor free the blocks of its arena.
  if (queue_owner < 0 && !RouteMatches(*msg)) return;
  const PsHeader& h = msg->header;
  const int sender = queue_owner >= 0 ? queue_owner : h.sender();
  std::shared_ptr<ShmMapping> mapping = ArenaOf(sender);
  // Hand back the sender's shared-memory blocks that the message names but
  // that were never resolved, so its ring is not stalled behind them.
  if (HasUnresolvedShmValues(h, msg->values.size())) {
    ReleaseUnresolvedShmValues(h, msg->values.size(), mapping.get(), self_id_.load());
  }
  // A numbered message that is dropped must not hold up the ones after it.
  if (std::optional<SeqSlot> slot = DroppedSlot(h, queue_owner)) {
    const Reorderer::Outcome outcome =
        mapping != nullptr ? order_.Skip(slot->sender, slot->stream, slot->seq, handler_)
                           : order_.Pass(slot->sender, slot->stream, slot->seq, nullptr, handler_);
    if (Reorderer::Ignored(outcome)) {
      ++dropped_;
    }
  }
}

bool Van::ReceiveOne() {
  std::vector<Blob> blobs;
  switch (router_->Receive(&blobs)) {
    case ZmqRouter::Read::kNone:
      return false;
    case ZmqRouter::Read::kTooManyFrames:
      Drop(nullptr, "more than " + std::to_string(ZmqRouter::kMaxFrames) + " frames");
      return true;
    case ZmqRouter::Read::kMessage:
      break;
  }
  if (IsBatch(blobs)) {
    for (Decoded& d : DecodeBatch(blobs)) {
      if (d.error.empty()) {
        Finish(std::move(d.msg));
      } else {
        Drop(d.header_ok ? &d.msg : nullptr, d.error);
      }
    }
    return true;
  }
  Decoded d = DecodeFrames(blobs);
  if (!d.error.empty()) {
    Drop(d.header_ok ? &d.msg : nullptr, d.error);
    return true;
  }
  Finish(std::move(d.msg));
  return true;
}

bool Van::RouteMatches(const Message& msg) {
  if (msg.route.empty()) return true;
  MutexLock l(&mu_);
  auto it = routes_.find(msg.header.sender());
  return it == routes_.end() || it->second == msg.route;
}

std::shared_ptr<ShmMapping> Van::ArenaOf(int sender) {
  MutexLock l(&mu_);
  auto it = peers_.find(sender);
  return it != peers_.end() ? it->second->theirs : nullptr;
}

// Checks a message from either path, resolves values in shared memory, and
// hands it on in its sender's order.
void Van::Finish(Message&& msg) {
  const PsHeader& h = msg.header;
  // Before anything else: nothing of a forged message may touch the claimed
  // sender's order or arena.
  if (!RouteMatches(msg)) {
    Drop(&msg, StrCat("a message claiming to come from ", NodeIdName(h.sender()),
                      " arrived on another node's connection: forged sender"));
    return;
  }
  if (h.version() != PROTOCOL_VERSION_CURRENT && h.cmd() != CMD_REGISTER) {
    Drop(&msg, StrCat("protocol version ", h.version(), " from ", NodeIdName(h.sender()),
                      ", expected ", static_cast<int>(PROTOCOL_VERSION_CURRENT)));
    return;
  }
  const bool data = h.cmd() == CMD_DATA;
  const bool in_shm = data && h.shm_frame_offset_size() > 0;
  std::shared_ptr<ShmMapping> sender_arena;
  if (h.shm_mapped() || in_shm || h.has_shm_seq()) {
    MutexLock l(&mu_);
    auto it = peers_.find(h.sender());
    if (it != peers_.end()) {
      if (h.shm_mapped()) it->second->maps_mine = true;
      sender_arena = it->second->theirs;
    }
  }
  if (in_shm) {
    Status s = ResolveShmValues(h, sender_arena.get(), self_id_.load(), &msg.values);
    if (!s.ok()) {
      Drop(&msg, s.message());
      return;
    }
  }
  if (data) {
    Status s = ValidateFrames(msg);
    if (!s.ok()) {
      Drop(&msg, s.message());
      return;
    }
  }
  if (options_.verbose >= 2) {
    LOG(INFO) << options_.name << " <- " << h.ShortDebugString();
  }
  if (!h.has_shm_seq()) {
    handler_(std::move(msg));
    return;
  }
  const int sender = h.sender();
  const uint64_t stream = h.shm_stream();
  const uint64_t seq = h.shm_seq();
  // A sender whose arena is not mapped here has no queue here: its messages
  // come over ZeroMQ alone, in order, and are not held.
  const Reorderer::Outcome outcome =
      sender_arena != nullptr ? order_.Deliver(sender, stream, seq, std::move(msg), handler_)
                              : order_.Pass(sender, stream, seq, &msg, handler_);
  if (Reorderer::Ignored(outcome)) {
    ++dropped_;
  }
}

}  // namespace pstrain
