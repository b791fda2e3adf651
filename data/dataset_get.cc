#include "data/dataset_get.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

#include "common/deadline.h"
#include "common/sha256.h"
#include "data/dataset_manifest.h"
#include "data/tar_gz.h"

namespace pstrain {
namespace {

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Status MakeDirs(const std::string& dir) {
  size_t at = 0;
  while (at <= dir.size()) {
    size_t slash = dir.find('/', at);
    if (slash == std::string::npos) slash = dir.size();
    const std::string path = dir.substr(0, slash);
    at = slash + 1;
    if (path.empty() || path == ".") continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::IOError(StrCat(path, ": cannot create folder: ", std::strerror(errno)));
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::IOError(StrCat(dir, " is not a folder"));
  }
  return Status::Ok();
}

// An exclusive flock on a file, released when destroyed (or the process ends).
class FolderLock {
 public:
  ~FolderLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Acquire(const std::string& path, Deadline deadline, FetchProgress* progress) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::IOError(StrCat(path, ": cannot open: ", std::strerror(errno)));
    const auto start = SteadyClock::now();
    bool said = false;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        return Status::IOError(StrCat(path, ": cannot lock: ", std::strerror(errno)));
      }
      if (deadline.Expired()) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::seconds>(SteadyClock::now() - start).count();
        return Status::DeadlineExceeded(
            StrCat("another process has held ", path, " for ", waited,
                   " s (still fetching into that folder?); gave up waiting"));
      }
      if (!said && progress != nullptr) {
        progress->Line(
            StrCat("waiting for another pstrain fetching into the same folder (", path, ")"));
        said = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return Status::Ok();
  }

 private:
  int fd_ = -1;
};

std::vector<std::string> MirrorsOf(const DatasetManifest& m, const GetOptions& options) {
  if (!options.mirrors.empty()) return options.mirrors;
  return {m.mirror().begin(), m.mirror().end()};
}

std::string DoneLine(const std::string& set, const std::string& name, const FetchResult& r) {
  std::string line = StrCat(set, ": ", name, "  ", HumanBytes(static_cast<double>(r.bytes)));
  if (r.transferred > 0) {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.2f", r.seconds);
    line +=
        StrCat(" from ", r.url, " in ", secs, " s (",
               HumanBytes(static_cast<double>(r.transferred) / std::max(r.seconds, 1e-3)), "/s)");
  } else {
    line += StrCat(" from ", r.url);
  }
  if (r.resumed_from > 0) line += StrCat(", resumed at byte ", r.resumed_from);
  return line + ", sha256 ok";
}

}  // namespace

Status GetDataset(const DatasetManifest& manifest, const std::string& dir,
                  const GetOptions& options, GetReport* report) {
  *report = GetReport();
  FetchProgress* progress = options.fetch.progress;
  auto say = [&](const std::string& text) {
    if (progress != nullptr) progress->Line(text);
  };
  RETURN_IF_ERROR(MakeDirs(dir));
  FolderLock lock;
  RETURN_IF_ERROR(lock.Acquire(dir + "/.pstrain-get.lock",
                               Deadline::InMillis(options.lock_timeout_ms), progress));
  const std::string& set = manifest.name();
  // Every provided file there with its digest (for mnist: every fetched file).
  if (CheckDatasetReady(manifest, dir, /*check_digests=*/true).ok()) {
    report->already_there = true;
    return Status::Ok();
  }
  const std::vector<std::string> mirrors = MirrorsOf(manifest, options);
  if (mirrors.empty()) {
    return Status::FailedPrecondition(
        StrCat(set, " has no mirror to fetch from\n", OfflineHelp(manifest, dir, mirrors)));
  }
  // A mirror that cannot be reached for one file is tried last for the next.
  std::set<std::string> unreachable;
  FetchOptions fetch = options.fetch;
  if (fetch.unreachable == nullptr) fetch.unreachable = &unreachable;
  std::vector<std::string> unpacked_archives;  // removed once the set is complete
  for (const DatasetFile& f : manifest.file()) {
    const std::string path = dir + "/" + f.name();
    bool have = false;
    if (IsFile(path)) {
      ASSIGN_OR_RETURN(std::string got, Sha256FileHex(path));
      have = got == f.sha256();
      if (!have) {
        say(StrCat(set, ": ", path, " has sha256 ", got, ", expected ", f.sha256(),
                   ": fetching it again"));
        std::remove(path.c_str());
      }
    }
    if (!have) {
      FetchSpec spec;
      for (const std::string& m : mirrors) spec.urls.push_back(MirrorUrl(m, set, f.name()));
      spec.path = path;
      spec.label = StrCat(set, " ", f.name());
      spec.size = f.size();
      spec.sha256 = f.sha256();
      auto fetched = FetchFile(spec, fetch);
      if (!fetched.ok()) {
        return Status(fetched.status().code(),
                      fetched.status().message() + "\n\n" + OfflineHelp(manifest, dir, mirrors));
      }
      say(DoneLine(set, f.name(), *fetched));
      report->fetched.push_back(*fetched);
    }
    if (f.unpack() == "tar.gz") {
      UnpackOptions uo;
      uo.strip_prefix = f.strip_prefix();
      std::vector<UnpackedFile> files;
      RETURN_IF_ERROR(UnpackTarGz(path, dir, uo, &files));
      for (const UnpackedFile& u : files) report->unpacked.push_back(u.path);
      say(StrCat(set, ": unpacked ", files.size(), " files from ", f.name(), " into ", dir));
      unpacked_archives.push_back(path);
    }
  }
  Status ready = CheckDatasetReady(manifest, dir, /*check_digests=*/true);
  if (!ready.ok()) {
    // The archives stay: a manifest mended to match them needs no new download.
    return Status::Corruption(
        StrCat(set, " was fetched into ", dir, " but is not complete: ", ready.message()));
  }
  // The unpacked files are what the readers use.
  for (const std::string& archive : unpacked_archives) std::remove(archive.c_str());
  return Status::Ok();
}

std::string OfflineHelp(const DatasetManifest& manifest, const std::string& dir,
                        const std::vector<std::string>& mirrors) {
  const std::string& set = manifest.name();
  std::string out = StrCat("Without a connection: put these files in ", dir,
                           " and run the same command again (each is checked by its SHA-256",
                           manifest.file_size() > 0 && !manifest.file(0).unpack().empty()
                               ? "; archives are unpacked there"
                               : "",
                           "):\n");
  for (const DatasetFile& f : manifest.file()) {
    out += StrCat("  ", f.name(), "  ", f.size() > 0 ? StrCat(f.size(), " bytes  ") : "", "sha256 ",
                  f.sha256(), "\n");
  }
  bool archives = false;
  for (const DatasetFile& f : manifest.file()) archives |= !f.unpack().empty();
  if (archives) {
    std::string names;
    for (const DatasetFile& f : ProvidedFiles(manifest)) names += " " + f.name();
    out += StrCat("or, already unpacked:", names, "\n");
  }
  if (!mirrors.empty()) {
    out += "from any of:\n";
    for (const DatasetFile& f : manifest.file()) {
      for (const std::string& m : mirrors) out += "  " + MirrorUrl(m, set, f.name()) + "\n";
    }
  }
  out += StrCat(
      "Behind a proxy: set https_proxy (and http_proxy). A mirror of your own (a web server, or "
      "file:///path/ for a local copy): --mirror URL or PSTRAIN_DATA_MIRRORS=URL. A folder that "
      "already holds ",
      set, ": --data-dir DIR, or PSTRAIN_DATA=ROOT with ROOT/", set, ".",
      manifest.homepage().empty() ? "" : StrCat(" About ", set, ": ", manifest.homepage()));
  return out;
}

std::vector<std::pair<std::string, std::string>> DatasetSearchPath(const std::string& name,
                                                                   const DataEnv& env) {
  std::vector<std::pair<std::string, std::string>> out;
  if (name == "mnist" && !env.mnist_dir.empty())
    out.emplace_back(env.mnist_dir, "PSTRAIN_MNIST_DIR");
  if (!env.data_root.empty()) out.emplace_back(env.data_root + "/" + name, "PSTRAIN_DATA");
  out.emplace_back("datasets/" + name, "datasets/");
  out.emplace_back("../shared/data/" + name, "../shared/data/");
  return out;
}

std::string DefaultDatasetDir(const std::string& name, const DataEnv& env) {
  return env.data_root.empty() ? "datasets/" + name : env.data_root + "/" + name;
}

StatusOr<Located> LocateDataset(const DatasetManifest& manifest, const DataEnv& env, bool download,
                                const GetOptions& options) {
  const std::string& set = manifest.name();
  std::string searched;
  for (const auto& [dir, origin] : DatasetSearchPath(set, env)) {
    Status ready = CheckDatasetReady(manifest, dir, /*check_digests=*/false);
    if (ready.ok()) return Located{dir, origin, GetReport()};
    if (origin == "PSTRAIN_MNIST_DIR") {
      return Status::NotFound(StrCat("PSTRAIN_MNIST_DIR=", dir, ": ", ready.message()));
    }
    searched += (searched.empty() ? "" : ", ") + dir;
  }
  const std::string target = DefaultDatasetDir(set, env);
  if (!download) {
    return Status::NotFound(StrCat("no folder holds ", set, " (looked in ", searched,
                                   "); `pstrain data get ", set, "` fetches it into ", target,
                                   "\n\n",
                                   OfflineHelp(manifest, target, MirrorsOf(manifest, options))));
  }
  Located out;
  out.dir = target;
  RETURN_IF_ERROR(GetDataset(manifest, target, options, &out.report));
  // Complete without fetching: another process fetched it while we waited.
  out.origin = out.report.already_there ? "fetched by another process" : "fetched";
  return out;
}

StatusOr<Located> EnsureDataset(const DatasetManifest& manifest, const std::string& data_dir,
                                const DataEnv& env, const GetOptions& options) {
  if (data_dir.empty()) return LocateDataset(manifest, env, /*download=*/true, options);
  Located out;
  out.dir = data_dir;
  out.origin = "--data-dir";
  if (!CheckDatasetReady(manifest, data_dir, /*check_digests=*/false).ok()) {
    RETURN_IF_ERROR(GetDataset(manifest, data_dir, options, &out.report));
    out.origin = out.report.already_there ? "fetched by another process" : "fetched";
  }
  return out;
}

}  // namespace pstrain
