// SnapshotStore: durable per-key snapshots of one server's shard, so that a
// server killed (kill -9) and restarted by the launcher reloads the latest
// value and optimizer state of every key it owns.
//
// One folder per server rank; one file per key, "key-<wire key as 16
// lowercase hex digits>.snap", holding two slots that are written
// alternately, each with one pwritev (header, value, optimizer state: no copy
// of the value). Slot 0 starts at byte 0, slot 1 at byte `stride`; the file is
// 2 * stride bytes (sparse until slot 1 is written). Every integer is
// little-endian. A slot is:
//
//   offset  size  field
//    0       8    magic "PSSNAP01"
//    8       4    u32 format version (2)
//   12       4    u32 slot index (0 or 1): where this header belongs
//   16       8    u64 wire key (must match the file name)
//   24       8    u64 rounds: closed dist_sync rounds the value includes
//   32       8    u64 sequence: the file's write count, orders equal rounds
//   40       8    u64 stride: byte offset of slot 1
//   48       8    u64 n: value elements
//   56       8    u64 optimizer state elements (0 to 3 times n: ParamState::slots)
//   64       8    i64 num_updates
//   72       4    f32 lr_mult
//   76       4    f32 wd_mult
//   80       4    i32 slot layout: Optimizer::SlotLayout of the optimizer that
//                 wrote the state (-1: unknown, as a restored one's)
//   84       4    u32 zero (reserved)
//   88       8    i64 earlier updates (ParamState::earlier_updates; not less
//                 than -num_updates; it and num_updates at most 2^62)
//   96       4    u32 CRC-32C of the payload
//  100       4    u32 CRC-32C of bytes [0, 100) of this header
//  104            payload: n float32 value, then the state's float32s
//
// Version 1 is read too: its header is 88 bytes, without the slot layout and
// earlier updates (read as -1, unknown, and 0), the payload CRC at 80 and the
// header CRC (of [0, 84)) at 84. Its state may be any optimizer's. Without
// the layout, a state restored after a configuration changed the optimizer
// to one with as many arrays (SGD to NAG, say) before the key was updated
// again was taken as the new optimizer's; a key restored from a version-1
// slot keeps that risk until its next update records the layout.
//
// stride is the header plus room for a value and its state, at least a
// momentum's (n floats), rounded up to 4 KiB, so a slot never grows into the
// other when the momentum appears (a state of more arrays, Adam's, re-creates
// the file once, as below).
// A file is created (and re-created when a key's size grows past its stride)
// by writing slot 0 to "<name>.tmp" and renaming it, so a file under its final
// name always holds one complete snapshot.
//
// Loading takes the valid slot with the most rounds (then the highest
// sequence); a slot is valid when its magic, version, slot index, header CRC,
// wire key, sizes (within the stride and the file) and payload CRC all agree.
// A write torn by a crash damages only the slot being written, which is never
// the newest valid one, so the previous snapshot survives.
//
// Durability: without `sync`, a write is done when the kernel has the bytes,
// which is all a killed process needs (the page cache outlives it); a crash
// of the machine can lose or tear writes not yet flushed. With `sync`, every
// write ends with fdatasync (and file creation with an fsync of the folder),
// so a finished Write survives power loss. That costs a device flush per
// Write, paid by the calling shard thread. Measured on the development VM (ext4
// on a virtio disk, 50 writes each): a 1000-float key with momentum 0.002 ms
// without sync, 3.6 ms with; a 1e6-float key with momentum (8 MB) 1.7 ms
// without sync (a copy into the page cache and a CRC pass at about 6.7 GB/s),
// 6.6 ms with. Disks and network file systems flush more slowly still.
#ifndef PSTRAIN_SERVER_SNAPSHOT_H_
#define PSTRAIN_SERVER_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "nn/optimizer.h"

namespace pstrain {

// One key's state as a snapshot holds it.
struct KeySnapshot {
  uint64_t wire_key = 0;
  uint64_t rounds = 0;  // closed dist_sync rounds this value includes
  std::vector<float> value;
  ParamState state;  // slots: 0 to 3 times value.size() elements
};

class SnapshotStore {
 public:
  // Opens the store in `dir`, creating it and its missing parents (mode 0700).
  // Existing snapshot files are left as they are (LoadAll reads them; Clear
  // removes them). `sync`: fdatasync after every write (see the cost above).
  // IOError naming the folder if it cannot be created or opened.
  static StatusOr<std::unique_ptr<SnapshotStore>> Open(const std::string& dir, bool sync = false);
  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // Stores a snapshot of key `wire_key`: `rounds`, value[0, n) and `state`
  // (state.slots 0 to 3 times n elements). It goes to the slot not holding the
  // key's newest valid snapshot; the first Write of a key in this process reads
  // its file (if any) once to find that slot. Keeps one file descriptor open
  // per key written.
  // Thread-safe: the server's shard threads call it concurrently for different
  // keys (calls for one key are serialized).
  // FailedPrecondition if `rounds` is less than the rounds of the key's newest
  // snapshot (a job that starts fresh calls Clear first); InvalidArgument for
  // a state of another size; IOError naming the file, key and offset if the
  // OS refuses. After a failed Write the key's previous snapshot still loads.
  Status Write(uint64_t wire_key, uint64_t rounds, const float* value, size_t n,
               const ParamState& state);

  // Every key's newest valid snapshot, sorted by wire key; empty for an empty
  // folder. Files whose names do not start with "key-" and end with ".snap"
  // are ignored. Corruption naming the file when a "key-*.snap" name is not
  // "key-<16 hex digits>.snap" or when neither slot of a file is valid (the
  // message says what was wrong with each: bad magic, CRC mismatch at an
  // offset, a length that disagrees with the file size, a wire key that
  // disagrees with the file name); IOError when a file cannot be read. Memory
  // is bounded by the files' sizes, whatever their headers say.
  // Meant for start-up, before any Write.
  StatusOr<std::vector<KeySnapshot>> LoadAll() const;

  // Removes every snapshot file (and leftover "*.snap.tmp" file) from the
  // folder and forgets the open files: a job that starts fresh.
  // REQUIRES: no Write runs concurrently.
  Status Clear();

  const std::string& dir() const { return dir_; }
  bool sync() const { return sync_; }

 private:
  class KeyFile;  // one key's open file and slot bookkeeping (snapshot.cc)

  SnapshotStore(std::string dir, int dir_fd, bool sync)
      : dir_(std::move(dir)), dir_fd_(dir_fd), sync_(sync) {}

  const std::string dir_;
  const int dir_fd_;  // the folder, for fsync after creating or removing files
  const bool sync_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<KeyFile>> files_ GUARDED_BY(mu_);
};

// CRC-32C (Castagnoli) of data[0, n) continued from `crc`, the CRC of the bytes
// before them (0 for none): Crc32c(Crc32c(0, a), b) is the CRC of a then b.
// Uses SSE4.2 when the build targets it. The snapshot files' checksum.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

namespace internal {
// The table-driven CRC-32C, for tests comparing it with Crc32c.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);
}  // namespace internal

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_SNAPSHOT_H_
