// SnapshotStore: round trips, slot choice, torn and damaged files, names,
// Clear, concurrent writers, a large value; the CRC-32C it uses.
#include "server/snapshot.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Layout facts from snapshot.h (version 2).
constexpr size_t kHeaderSize = 104;
constexpr size_t kNOffset = 48;
constexpr size_t kStateNOffset = 56;
constexpr size_t kEarlierUpdatesOffset = 88;
constexpr size_t kHeaderCrcOffset = 100;

std::vector<float> Ramp(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.5f * static_cast<float>(i);
  return v;
}

ParamState State(size_t slots_n, int64_t num_updates, float lr_mult, float wd_mult) {
  ParamState s;
  s.slots = Ramp(slots_n, -3.0f);
  s.num_updates = num_updates;
  s.lr_mult = lr_mult;
  s.wd_mult = wd_mult;
  return s;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
// Sets the u64 at `offset` of slot 0's header to `v` and makes the header's
// CRC agree, so that only the field's check can refuse it.
void SetHeaderField(const std::string& path, size_t offset, uint64_t v) {
  std::string bytes = ReadFile(path);
  std::memcpy(&bytes[offset], &v, 8);
  const uint32_t crc = Crc32c(0, bytes.data(), kHeaderCrcOffset);
  std::memcpy(&bytes[kHeaderCrcOffset], &crc, 4);
  WriteFile(path, bytes);
}
// Overwrites bytes [offset, offset + n) of a file with 0xA5.
void Scribble(const std::string& path, size_t offset, size_t n) {
  std::string bytes = ReadFile(path);
  ASSERT_LE(offset + n, bytes.size());
  for (size_t i = 0; i < n; ++i) bytes[offset + i] = static_cast<char>(0xA5);
  WriteFile(path, bytes);
}

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("pstrain_snapshot_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    dir_ = (root_ / "job" / "server-0").string();
    store_ = Open();
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(root_);
  }

  std::unique_ptr<SnapshotStore> Open(bool sync = false) {
    auto store = SnapshotStore::Open(dir_, sync);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }
  std::string PathOf(const char* hex16) const { return dir_ + "/key-" + hex16 + ".snap"; }
  // The only snapshot LoadAll returns.
  KeySnapshot LoadOne() {
    auto all = store_->LoadAll();
    EXPECT_TRUE(all.ok()) << all.status();
    if (!all.ok() || all->size() != 1) {
      ADD_FAILURE() << "expected one snapshot";
      return {};
    }
    return (*all)[0];
  }
  // Writes `rounds` of key 7 with a value and momentum derived from it.
  void WriteKey7(uint64_t rounds, size_t n = 100) {
    ASSERT_OK(store_->Write(7, rounds, Ramp(n, static_cast<float>(rounds)).data(), n,
                            State(n, static_cast<int64_t>(rounds), 1.0f, 1.0f)));
  }

  fs::path root_;
  std::string dir_;
  std::unique_ptr<SnapshotStore> store_;
};

TEST(Crc32cTest, KnownValueAndPortableAgree) {
  const char* check = "123456789";
  EXPECT_EQ(Crc32c(0, check, 9), 0xE3069283u);
  EXPECT_EQ(internal::Crc32cPortable(0, check, 9), 0xE3069283u);
  EXPECT_EQ(Crc32c(Crc32c(0, check, 4), check + 4, 5), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
  std::mt19937 rng(1701);
  std::vector<uint8_t> bytes(1000);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  for (size_t start : {0, 1, 3, 7}) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 500, 993}) {
      EXPECT_EQ(Crc32c(0, bytes.data() + start, len),
                internal::Crc32cPortable(0, bytes.data() + start, len))
          << "start " << start << " len " << len;
    }
  }
}

TEST_F(SnapshotTest, OpenCreatesPrivateFolderAndEmptyLoad) {
  struct stat st;
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((root_ / "job").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(store_->dir(), dir_);
  auto all = store_->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->empty());
}

TEST_F(SnapshotTest, OpenOnAFileFails) {
  const std::string file = (root_ / "plain").string();
  WriteFile(file, "x");
  auto store = SnapshotStore::Open(file + "/sub");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kIOError);
  EXPECT_THAT(store.status().message(), HasSubstr(file));
}

TEST_F(SnapshotTest, RoundTripSeveralKeys) {
  // Keys written out of order; momentum empty, full; a key of 0 elements.
  const std::vector<float> a = Ramp(10, 1.0f), b = Ramp(3, -7.0f);
  ASSERT_OK(store_->Write(0xdeadbeef00000001ull, 5, a.data(), a.size(), State(10, 42, 0.5f, 0.0f)));
  ASSERT_OK(store_->Write(3, 2, b.data(), b.size(), State(0, 0, 1.0f, 1.0f)));
  ASSERT_OK(store_->Write(0, 0, nullptr, 0, State(0, 7, 2.0f, 3.0f)));
  EXPECT_TRUE(fs::exists(PathOf("deadbeef00000001")));
  EXPECT_TRUE(fs::exists(PathOf("0000000000000003")));

  store_ = Open();  // a restarted server
  auto all = store_->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  const KeySnapshot& k0 = (*all)[0];
  EXPECT_EQ(k0.wire_key, 0u);
  EXPECT_EQ(k0.rounds, 0u);
  EXPECT_TRUE(k0.value.empty());
  EXPECT_EQ(k0.state.num_updates, 7);
  EXPECT_EQ(k0.state.lr_mult, 2.0f);
  EXPECT_EQ(k0.state.wd_mult, 3.0f);
  const KeySnapshot& k3 = (*all)[1];
  EXPECT_EQ(k3.wire_key, 3u);
  EXPECT_EQ(k3.rounds, 2u);
  EXPECT_EQ(k3.value, b);
  EXPECT_TRUE(k3.state.slots.empty());
  EXPECT_EQ(k3.state.num_updates, 0);
  EXPECT_EQ(k3.state.lr_mult, 1.0f);
  const KeySnapshot& big = (*all)[2];
  EXPECT_EQ(big.wire_key, 0xdeadbeef00000001ull);
  EXPECT_EQ(big.rounds, 5u);
  EXPECT_EQ(big.value, a);
  EXPECT_EQ(big.state.slots, Ramp(10, -3.0f));
  EXPECT_EQ(big.state.num_updates, 42);
  EXPECT_EQ(big.state.lr_mult, 0.5f);
  EXPECT_EQ(big.state.wd_mult, 0.0f);
}

TEST_F(SnapshotTest, NewerSlotWinsInEitherSlot) {
  for (uint64_t r = 1; r <= 5; ++r) {
    WriteKey7(r);
    const KeySnapshot s = LoadOne();
    EXPECT_EQ(s.rounds, r);
    EXPECT_EQ(s.value, Ramp(100, static_cast<float>(r)));
    EXPECT_EQ(s.state.num_updates, static_cast<int64_t>(r));
  }
}

TEST_F(SnapshotTest, EqualRoundsLaterWriteWins) {
  // dist_async: rounds stay put, the write order decides.
  for (float start : {1.0f, 2.0f, 3.0f}) {
    ASSERT_OK(store_->Write(7, 0, Ramp(4, start).data(), 4, State(0, 0, 1, 1)));
  }
  EXPECT_EQ(LoadOne().value, Ramp(4, 3.0f));
  store_ = Open();  // the order survives a restart
  ASSERT_OK(store_->Write(7, 0, Ramp(4, 9.0f).data(), 4, State(0, 0, 1, 1)));
  EXPECT_EQ(LoadOne().value, Ramp(4, 9.0f));
}

TEST_F(SnapshotTest, MomentumAppearsLater) {
  ASSERT_OK(store_->Write(7, 1, Ramp(50, 1).data(), 50, State(0, 0, 1, 1)));
  ASSERT_OK(store_->Write(7, 2, Ramp(50, 2).data(), 50, State(50, 1, 1, 1)));
  KeySnapshot s = LoadOne();
  EXPECT_EQ(s.rounds, 2u);
  EXPECT_EQ(s.state.slots, Ramp(50, -3.0f));
}

TEST_F(SnapshotTest, RoundsMustNotGoBack) {
  WriteKey7(10);
  store_ = Open();
  const std::vector<float> v = Ramp(100, 0);
  Status s = store_->Write(7, 9, v.data(), v.size(), State(0, 0, 1, 1));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(PathOf("0000000000000007")));
  EXPECT_EQ(LoadOne().rounds, 10u);
}

// Adam's two arrays and centered RMSProp's three: a key that had none, or a
// momentum's worth, gains them. The file is re-created once with room for
// them (its stride grows); every later write alternates slots in place, and
// each write loads back whole, the older slot surviving a torn newer one.
TEST_F(SnapshotTest, StateOfSeveralArraysAppearsLaterAndAlternatesSlots) {
  const std::string path = PathOf("0000000000000007");
  const size_t n = 2000;  // 8 KB of value: the stride is not its minimum
  ASSERT_OK(store_->Write(7, 1, Ramp(n, 1).data(), n, State(0, 0, 1, 1)));
  const uintmax_t size_without = fs::file_size(path);
  for (uint64_t round = 2; round <= 5; ++round) {
    ASSERT_OK(store_->Write(7, round, Ramp(n, static_cast<float>(round)).data(), n,
                            State(3 * n, static_cast<int64_t>(round), 1, 1)));
    store_ = Open();
    KeySnapshot s = LoadOne();
    EXPECT_EQ(s.rounds, round);
    EXPECT_EQ(s.value, Ramp(n, static_cast<float>(round)));
    EXPECT_EQ(s.state.slots, Ramp(3 * n, -3.0f));
    EXPECT_EQ(s.state.slot_layout, -1) << "a restored state's layout is the optimizer's to judge";
  }
  EXPECT_GT(fs::file_size(path), size_without) << "the stride grew for the three arrays";
  // The newest (round 5) torn: round 4 loads, three arrays and all.
  const uintmax_t size = fs::file_size(path);
  Scribble(path, size / 2 + kHeaderSize + 100, 16);
  store_ = Open();
  auto all = store_->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  const KeySnapshot& s = (*all)[0];
  EXPECT_EQ(s.state.slots.size(), 3 * n);
  EXPECT_EQ(s.rounds, 4u) << "round 5 went to slot 1 (2: slot 0 of the new file, 3: 1, 4: 0)";
}

TEST_F(SnapshotTest, MomentumOfWrongSizeIsInvalid) {
  const std::vector<float> v = Ramp(10, 0);
  for (size_t bad : {size_t{9}, size_t{15}, size_t{40}}) {
    Status s = store_->Write(7, 1, v.data(), v.size(), State(bad, 0, 1, 1));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(StrCat("optimizer state of ", bad, " floats")));
  }
}

// A header whose state length is no whole number of arrays (or more than
// three), with valid CRCs, is Corruption naming the field's offset.
TEST_F(SnapshotTest, StateLengthThatIsNoWholeNumberOfArraysIsCorruption) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(1, 10);
  for (uint64_t bad : {uint64_t{15}, uint64_t{40}}) {
    SetHeaderField(path, kStateNOffset, bad);
    auto all = store_->LoadAll();
    ASSERT_FALSE(all.ok());
    EXPECT_EQ(all.status().code(), StatusCode::kCorruption);
    EXPECT_THAT(all.status().message(),
                HasSubstr(StrCat("optimizer state length ", bad, " at offset 56")));
  }
}

TEST_F(SnapshotTest, TruncatedNewerSlotFallsBackToOlder) {
  WriteKey7(1);  // slot 0
  WriteKey7(2);  // slot 1 (the tail of the file)
  const std::string path = PathOf("0000000000000007");
  const uintmax_t size = fs::file_size(path);
  fs::resize_file(path, size / 2 + kHeaderSize + 40);  // slot 1's header and part of its payload
  EXPECT_EQ(LoadOne().rounds, 1u);
  fs::resize_file(path, size / 2 + 10);  // part of slot 1's header
  KeySnapshot s = LoadOne();
  EXPECT_EQ(s.rounds, 1u);
  EXPECT_EQ(s.value, Ramp(100, 1.0f));
}

TEST_F(SnapshotTest, ScribbledNewerSlotFallsBackToOlder) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(1);
  WriteKey7(2);
  WriteKey7(3);                          // slot 0 again: newest
  Scribble(path, kHeaderSize + 100, 8);  // its payload
  KeySnapshot s = LoadOne();
  EXPECT_EQ(s.rounds, 2u);
  EXPECT_EQ(s.value, Ramp(100, 2.0f));
  Scribble(path, 20, 4);  // its header: slot 1 is found from the file size
  EXPECT_EQ(LoadOne().rounds, 2u);
}

TEST_F(SnapshotTest, RestartWritesOverTheTornSlot) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(1);
  WriteKey7(2);
  WriteKey7(3);                          // slot 0
  Scribble(path, kHeaderSize + 100, 8);  // torn: rounds 2 in slot 1 is the newest valid
  store_ = Open();
  WriteKey7(4);  // must go to slot 0, keeping rounds 2
  EXPECT_EQ(LoadOne().rounds, 4u);
  Scribble(path, kHeaderSize + 100, 8);
  EXPECT_EQ(LoadOne().rounds, 2u);
}

TEST_F(SnapshotTest, BothSlotsCorruptIsAnErrorNamingTheFile) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(1);
  WriteKey7(2);
  const uintmax_t half = fs::file_size(path) / 2;
  Scribble(path, kHeaderSize + 4, 4);         // slot 0 payload
  Scribble(path, half + kHeaderSize + 4, 4);  // slot 1 payload
  auto all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(all.status().message(), HasSubstr(path));
  EXPECT_THAT(all.status().message(),
              HasSubstr("slot 0: payload CRC-32C mismatch over bytes [104,"));
  EXPECT_THAT(all.status().message(), HasSubstr("slot 1: payload CRC-32C mismatch"));

  // Garbage: bad magic in both places.
  WriteFile(path, std::string(8192, 'x'));
  all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(), HasSubstr(path));
  EXPECT_THAT(all.status().message(), HasSubstr("slot 0: bad magic at offset 0"));
  EXPECT_THAT(all.status().message(), HasSubstr("slot 1: bad magic at offset 4096"));

  // A short file.
  WriteFile(path, "PSSNAP01");
  all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(), HasSubstr("runs past the end of the file (size 8)"));
}

TEST_F(SnapshotTest, AbsurdLengthWithValidCrcIsCorruptionNotACrash) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(1);
  SetHeaderField(path, kNOffset, uint64_t{1} << 60);
  auto all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(all.status().message(), HasSubstr("value length 1152921504606846976 at offset 48"));
  EXPECT_THAT(all.status().message(), HasSubstr("does not fit the file"));
}

TEST_F(SnapshotTest, FileUnderAnotherKeysNameIsAnError) {
  WriteKey7(1);
  WriteKey7(2);
  const std::string wrong = PathOf("0000000000000008");
  fs::copy_file(PathOf("0000000000000007"), wrong);
  auto all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(all.status().message(), HasSubstr(wrong));
  EXPECT_THAT(all.status().message(),
              HasSubstr("wire key 7 at offset 16 disagrees with the file name (key 8)"));
}

TEST_F(SnapshotTest, BadNamesAreErrorsOtherFilesAreIgnored) {
  WriteKey7(1);
  WriteFile(dir_ + "/README", "not a snapshot");
  WriteFile(PathOf("0000000000000009") + ".tmp", "a write killed before its rename");
  EXPECT_EQ(LoadOne().wire_key, 7u);

  WriteFile(dir_ + "/key-7.snap", "short name");
  auto all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(), HasSubstr(dir_ + "/key-7.snap: not a snapshot file name"));
}

TEST_F(SnapshotTest, ClearRemovesEverySnapshot) {
  WriteKey7(1);
  const std::vector<float> v = Ramp(5, 0);
  ASSERT_OK(store_->Write(8, 1, v.data(), v.size(), State(0, 0, 1, 1)));
  WriteFile(PathOf("0000000000000009") + ".tmp", "leftover");
  WriteFile(dir_ + "/README", "kept");
  ASSERT_OK(store_->Clear());
  auto all = store_->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->empty());
  EXPECT_FALSE(fs::exists(PathOf("0000000000000009") + ".tmp"));
  EXPECT_TRUE(fs::exists(dir_ + "/README"));
  // A fresh job writes again, from round 0.
  ASSERT_OK(store_->Write(7, 0, v.data(), v.size(), State(0, 0, 1, 1)));
  EXPECT_EQ(LoadOne().value, v);
}

TEST_F(SnapshotTest, ValueGrowingPastTheStrideRewritesTheFile) {
  WriteKey7(1, 10);
  WriteKey7(2, 5000);
  KeySnapshot s = LoadOne();
  EXPECT_EQ(s.rounds, 2u);
  EXPECT_EQ(s.value, Ramp(5000, 2.0f));
  WriteKey7(3, 5000);
  WriteKey7(4, 7);  // smaller fits the stride
  s = LoadOne();
  EXPECT_EQ(s.rounds, 4u);
  EXPECT_EQ(s.value, Ramp(7, 4.0f));
}

TEST_F(SnapshotTest, CorruptFileIsReplacedByTheNextWrite) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(5);
  WriteFile(path, std::string(100, 'x'));
  store_ = Open();
  WriteKey7(1);  // no snapshot to compare rounds with
  EXPECT_EQ(LoadOne().rounds, 1u);
}

TEST_F(SnapshotTest, SyncWrites) {
  store_ = Open(/*sync=*/true);
  EXPECT_TRUE(store_->sync());
  WriteKey7(1);
  WriteKey7(2);
  EXPECT_EQ(LoadOne().rounds, 2u);
  ASSERT_OK(store_->Clear());
}

TEST_F(SnapshotTest, ConcurrentWritersOnDifferentKeys) {
  constexpr int kThreads = 4, kKeysPerThread = 8, kRounds = 20;
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t r = 1; r <= kRounds; ++r) {
        for (int k = 0; k < kKeysPerThread; ++k) {
          const uint64_t key = static_cast<uint64_t>(k * kThreads + t);
          const size_t n = 64 + key * 16;
          const std::vector<float> v = Ramp(n, static_cast<float>(key * 1000 + r));
          Status s = store_->Write(key, r, v.data(), n, State(r > 1 ? n : 0, r, 1, 1));
          if (!s.ok()) {
            results[t] = s;
            return;
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const Status& s : results) ASSERT_OK(s);
  auto all = store_->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), static_cast<size_t>(kThreads * kKeysPerThread));
  for (size_t i = 0; i < all->size(); ++i) {
    const KeySnapshot& s = (*all)[i];
    EXPECT_EQ(s.wire_key, i);
    EXPECT_EQ(s.rounds, static_cast<uint64_t>(kRounds));
    EXPECT_EQ(s.value, Ramp(64 + i * 16, static_cast<float>(i * 1000 + kRounds)));
    EXPECT_EQ(s.state.slots.size(), 64 + i * 16);
  }
}

TEST_F(SnapshotTest, MillionElementValue) {
  constexpr size_t kN = 1000000;
  std::vector<float> v(kN);
  std::mt19937 rng(1701);
  std::normal_distribution<float> normal;
  for (float& x : v) x = normal(rng);
  ParamState state = State(kN, 12, 1.0f, 0.0f);
  ASSERT_OK(store_->Write(42, 1, v.data(), kN, state));
  v[kN - 1] += 1.0f;
  ASSERT_OK(store_->Write(42, 2, v.data(), kN, state));
  store_ = Open();
  KeySnapshot s = LoadOne();
  EXPECT_EQ(s.wire_key, 42u);
  EXPECT_EQ(s.rounds, 2u);
  EXPECT_TRUE(s.value == v);  // not EXPECT_EQ: a mismatch would print 1e6 floats
  EXPECT_TRUE(s.state.slots == state.slots);
  EXPECT_EQ(s.state.num_updates, 12);
}

// Which optimizer wrote a state (its slot layout) and ADAM's earlier updates
// come back: a restarted server running another optimizer of as many arrays
// (SGD's momentum, NAG's) must start that key afresh, not take the state for
// its own (version 1 did not keep them).
TEST_F(SnapshotTest, TheSlotLayoutAndEarlierUpdatesComeBack) {
  const std::vector<float> v = Ramp(20, 1);
  ParamState sgd = State(20, 9, 1, 1);
  sgd.slot_layout = 0;  // Optimizer::Rule::kSgd
  ParamState adam = State(40, 9, 1, 1);
  adam.slot_layout = 3;                      // kAdam
  adam.earlier_updates = -4;                 // took SGD's state over after 4 updates
  ParamState restored = State(20, 2, 1, 1);  // slot_layout -1: unknown
  restored.earlier_updates = 100;            // resumed from a checkpoint
  ASSERT_OK(store_->Write(1, 3, v.data(), v.size(), sgd));
  ASSERT_OK(store_->Write(2, 3, v.data(), v.size(), adam));
  ASSERT_OK(store_->Write(3, 3, v.data(), v.size(), restored));
  store_ = Open();
  auto all = store_->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].state.slot_layout, 0);
  EXPECT_EQ((*all)[0].state.earlier_updates, 0);
  EXPECT_EQ((*all)[1].state.slot_layout, 3);
  EXPECT_EQ((*all)[1].state.earlier_updates, -4);
  EXPECT_EQ((*all)[1].state.slots, Ramp(40, -3.0f));
  EXPECT_EQ((*all)[2].state.slot_layout, -1);
  EXPECT_EQ((*all)[2].state.earlier_updates, 100);
}

// An ADAM count below zero (earlier updates below -num_updates), with valid
// CRCs, is Corruption naming the field's offset; so is an unknown version.
TEST_F(SnapshotTest, ANegativeUpdateCountOrAnUnknownVersionIsCorruption) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(1, 10);  // num_updates 1
  SetHeaderField(path, kEarlierUpdatesOffset, static_cast<uint64_t>(int64_t{-2}));
  auto all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(all.status().message(),
              HasSubstr("earlier updates -2 at offset 88 make the update count negative"));
  SetHeaderField(path, kEarlierUpdatesOffset, static_cast<uint64_t>(int64_t{-1}));
  EXPECT_EQ(LoadOne().state.earlier_updates, -1) << "t = 0 before the next update is valid";

  std::string bytes = ReadFile(path);
  const uint32_t version = 3;
  std::memcpy(&bytes[8], &version, 4);
  WriteFile(path, bytes);
  all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(),
              HasSubstr("format version 3 at offset 8 (this build reads 1 and 2)"));
}

// A version-1 slot, as servers before version 2 wrote it: 88 bytes of header,
// the payload CRC at 80 and the header's at 84.
std::string VersionOneSlot(uint64_t wire_key, uint32_t slot, uint64_t rounds, uint64_t sequence,
                           uint64_t stride, const std::vector<float>& value,
                           const std::vector<float>& state, int64_t num_updates) {
  std::string b(88, '\0');
  auto put = [&b](size_t offset, const auto& v) { std::memcpy(&b[offset], &v, sizeof(v)); };
  std::memcpy(&b[0], "PSSNAP01", 8);
  put(8, uint32_t{1});
  put(12, slot);
  put(16, wire_key);
  put(24, rounds);
  put(32, sequence);
  put(40, stride);
  put(48, uint64_t{value.size()});
  put(56, uint64_t{state.size()});
  put(64, num_updates);
  put(72, 1.0f);
  put(76, 1.0f);
  uint32_t crc = Crc32c(0, value.data(), value.size() * sizeof(float));
  crc = Crc32c(crc, state.data(), state.size() * sizeof(float));
  put(80, crc);
  put(84, Crc32c(0, b.data(), 84));
  b.append(reinterpret_cast<const char*>(value.data()), value.size() * sizeof(float));
  b.append(reinterpret_cast<const char*>(state.data()), state.size() * sizeof(float));
  return b;
}

// A version-1 file of key 7 as such a server left it: rounds 4 in slot 0,
// rounds 5 (the newest) in slot 1, each a value and one array of state of n.
void WriteVersionOneFile(const std::string& path, size_t n, uint64_t stride) {
  std::string file = VersionOneSlot(7, 0, 4, 1, stride, Ramp(n, 4), Ramp(n, -3), 4);
  file.resize(stride, '\0');
  file += VersionOneSlot(7, 1, 5, 2, stride, Ramp(n, 5), Ramp(n, -3), 5);
  file.resize(2 * stride, '\0');
  WriteFile(path, file);
}

// Snapshots a server of the last version left still load (a job resumed by
// a replacement of the new build), their layout unknown; the next writes go
// on in the same file, in the slot not holding the newest snapshot.
TEST_F(SnapshotTest, VersionOneFilesStillLoadAndAreWrittenOn) {
  const std::string path = PathOf("0000000000000007");
  const size_t n = 100;
  const uint64_t stride = 4096;
  WriteVersionOneFile(path, n, stride);
  KeySnapshot s = LoadOne();
  EXPECT_EQ(s.rounds, 5u);
  EXPECT_EQ(s.value, Ramp(n, 5));
  EXPECT_EQ(s.state.slots, Ramp(n, -3));
  EXPECT_EQ(s.state.num_updates, 5);
  EXPECT_EQ(s.state.slot_layout, -1);
  EXPECT_EQ(s.state.earlier_updates, 0);

  store_ = Open();
  WriteKey7(6, n);  // over round 4 in slot 0, as version 2
  s = LoadOne();
  EXPECT_EQ(s.rounds, 6u);
  EXPECT_EQ(s.value, Ramp(n, 6));
  Scribble(path, kHeaderSize + 8, 4);  // round 6 torn: the version-1 round 5 is the newest
  EXPECT_EQ(LoadOne().rounds, 5u);
}

// A version-1 file whose stride holds its 88-byte header and payload but not
// version 2's 104: the next write re-creates the file (as a key that grew).
TEST_F(SnapshotTest, AVersionOneStrideTooSmallForVersionTwoIsRecreated) {
  const std::string path = PathOf("0000000000000007");
  const size_t n = 500;  // 88 + 8 n = 4088 fits 4096; 104 + 8 n = 4104 does not
  const uint64_t stride = 4096;
  WriteVersionOneFile(path, n, stride);
  EXPECT_EQ(LoadOne().rounds, 5u);
  store_ = Open();
  WriteKey7(6, n);
  EXPECT_GT(fs::file_size(path), 2 * stride) << "the stride grew";
  KeySnapshot s = LoadOne();
  EXPECT_EQ(s.rounds, 6u);
  EXPECT_EQ(s.value, Ramp(n, 6));
  EXPECT_EQ(s.state.slots, Ramp(n, -3));
  WriteKey7(7, n);  // and the slots alternate in the new file
  EXPECT_EQ(LoadOne().rounds, 7u);
}

// The reserved field must be zero, and the update counts at most 2^62 (their
// sum could overflow), with valid CRCs.
TEST_F(SnapshotTest, ANonZeroReservedFieldOrAHugeCountIsCorruption) {
  const std::string path = PathOf("0000000000000007");
  WriteKey7(1, 10);
  const std::string good = ReadFile(path);
  SetHeaderField(path, 80, uint64_t{0x500000000ull} | 0xffffffffull);  // layout -1, reserved 5
  auto all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(), HasSubstr("reserved field at offset 84 is 5, not 0"));
  WriteFile(path, good);
  SetHeaderField(path, kEarlierUpdatesOffset, uint64_t{1} << 63 >> 1 | 1);  // 2^62 + 1
  all = store_->LoadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(), HasSubstr("exceed 2^62"));
}

}  // namespace
}  // namespace pstrain
