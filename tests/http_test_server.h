// A small HTTP/1.1 server for tests, on 127.0.0.1 in the test process: it
// serves files by name under any path prefix ("/good/x" and "/dead/x" are the
// same file x) and misbehaves on request, per prefix: 404, 500, a connection
// cut after N bytes, a corrupted byte, a stall, a Range ignored, a file cut
// short on the server. Every request is recorded (path and Range header).
// One thread accepts; each connection gets a thread; all are joined by Stop().
#ifndef PSTRAIN_TESTS_HTTP_TEST_SERVER_H_
#define PSTRAIN_TESTS_HTTP_TEST_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace pstrain::testing {

class TestHttpServer {
 public:
  enum class Mode {
    kServe,          // 200, or 206 for a Range "bytes=S-" / "bytes=S-E"; 416 past the end
    kNotFound,       // 404
    kServerError,    // 500
    kCutAfter,       // as kServe, but the connection closes after `n` body bytes
    kCorrupt,        // as kServe, with the byte at file offset `n` flipped
    kStall,          // as kServe, but after `n` body bytes nothing more is sent
    kIgnoreRange,    // always 200 with the whole file
    kTruncatedFile,  // the server's copy is only the first `n` bytes (honest lengths)
    kEndless,        // 200 without a Content-Length: the file, then `n` bytes more
    kSlow            // as kServe, pausing 4 s after each `n` body bytes
  };
  struct Rule {
    Mode mode = Mode::kServe;
    int64_t n = 0;
    int times = -1;  // requests it applies to; then kServe (-1: every one)
  };
  struct Request {
    std::string path;
    std::string range;  // the Range header, "" when none
    Mode mode = Mode::kServe;
  };

  TestHttpServer() = default;
  ~TestHttpServer() { Stop(); }
  TestHttpServer(const TestHttpServer&) = delete;
  TestHttpServer& operator=(const TestHttpServer&) = delete;

  void AddFile(const std::string& name, std::string bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    files_[name] = std::move(bytes);
  }
  bool AddFileFrom(const std::string& name, const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::stringstream s;
    s << in.rdbuf();
    AddFile(name, s.str());
    return true;
  }
  // `prefix` is the first path component ("dead" for /dead/...).
  void SetRule(const std::string& prefix, Rule rule) {
    std::lock_guard<std::mutex> lock(mu_);
    rules_[prefix] = rule;
  }

  // Binds 127.0.0.1 on a free port and starts serving. False on failure.
  bool Start() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return false;
    }
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return true;
  }

  void Stop() {
    stop_ = true;
    if (accept_thread_.joinable()) accept_thread_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(conn_threads_);
    }
    for (std::thread& t : threads) t.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
  }

  int port() const { return port_; }
  // "http://127.0.0.1:PORT/<prefix>/"
  std::string Url(const std::string& prefix) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + prefix + "/";
  }
  std::vector<Request> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  void ClearRequests() {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.clear();
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      conn_threads_.emplace_back([this, fd] {
        Handle(fd);
        ::close(fd);
      });
    }
  }

  // Sends all of `data`; false when the client went away or we are stopping.
  bool SendAll(int fd, const char* data, size_t size) {
    while (size > 0) {
      if (stop_) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
      if (n <= 0) return false;
      data += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  void Handle(int fd) {
    // The request head, within 5 s.
    std::string head;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (head.find("\r\n\r\n") == std::string::npos) {
      if (stop_ || std::chrono::steady_clock::now() > deadline || head.size() > 65536) return;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return;
      head.append(buf, static_cast<size_t>(n));
    }
    std::istringstream lines(head);
    std::string method, path, version, line, range;
    lines >> method >> path >> version;
    std::getline(lines, line);
    while (std::getline(lines, line) && line != "\r") {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon);
      for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ')) value.erase(0, 1);
      while (!value.empty() && (value.back() == '\r' || value.back() == ' ')) value.pop_back();
      if (key == "range") range = value;
    }
    const size_t slash = path.find('/', 1);
    const std::string prefix = slash == std::string::npos ? "" : path.substr(1, slash - 1);
    const std::string name = slash == std::string::npos ? path.substr(1) : path.substr(slash + 1);

    Rule rule;
    std::string body;
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto r = rules_.find(prefix);
      if (r != rules_.end() && r->second.times != 0) {
        rule = r->second;
        if (r->second.times > 0) --r->second.times;
      }
      requests_.push_back(Request{path, range, rule.mode});
      auto f = files_.find(name);
      if (f != files_.end()) {
        body = f->second;
        found = true;
      }
    }
    auto reply = [&](int code, const std::string& text) {
      std::string r =
          "HTTP/1.1 " + std::to_string(code) + " " + text +
          "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(text.size() + 1) +
          "\r\nConnection: close\r\n\r\n" + text + "\n";
      SendAll(fd, r.data(), r.size());
    };
    if (rule.mode == Mode::kNotFound || !found) return reply(404, "Not Found");
    if (rule.mode == Mode::kServerError) return reply(500, "Internal Server Error");
    if (rule.mode == Mode::kTruncatedFile) body.resize(std::min<size_t>(body.size(), rule.n));
    if (rule.mode == Mode::kCorrupt && rule.n < static_cast<int64_t>(body.size())) {
      body[rule.n] = static_cast<char>(body[rule.n] ^ 0x5a);
    }
    int64_t start = 0, end = static_cast<int64_t>(body.size()) - 1;
    bool partial = false;
    if (!range.empty() && rule.mode != Mode::kIgnoreRange && range.rfind("bytes=", 0) == 0) {
      const std::string spec = range.substr(6);
      const size_t dash = spec.find('-');
      start = std::atoll(spec.substr(0, dash).c_str());
      if (dash != std::string::npos && dash + 1 < spec.size()) {
        end = std::min<int64_t>(end, std::atoll(spec.substr(dash + 1).c_str()));
      }
      if (start >= static_cast<int64_t>(body.size())) {
        std::string r = "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */" +
                        std::to_string(body.size()) +
                        "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        SendAll(fd, r.data(), r.size());
        return;
      }
      partial = true;
    }
    if (rule.mode == Mode::kEndless) {
      // No length and no end in sight: only the client can stop it.
      std::string head =
          "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
          "Connection: close\r\n\r\n";
      if (!SendAll(fd, head.data(), head.size()) || !SendAll(fd, body.data(), body.size())) return;
      const std::string more(65536, 'x');
      for (int64_t sent = 0; sent < rule.n && !stop_; sent += static_cast<int64_t>(more.size())) {
        if (!SendAll(fd, more.data(), more.size())) return;
      }
      return;
    }
    const int64_t length = end - start + 1;
    std::string h = partial ? "HTTP/1.1 206 Partial Content\r\n" : "HTTP/1.1 200 OK\r\n";
    h += "Content-Type: application/octet-stream\r\nContent-Length: " + std::to_string(length) +
         "\r\n";
    if (partial) {
      h += "Content-Range: bytes " + std::to_string(start) + "-" + std::to_string(end) + "/" +
           std::to_string(body.size()) + "\r\n";
    }
    h += "Connection: close\r\n\r\n";
    if (!SendAll(fd, h.data(), h.size())) return;
    int64_t send = length;
    if (rule.mode == Mode::kCutAfter || rule.mode == Mode::kStall) {
      send = std::min<int64_t>(length, rule.n);
    }
    if (rule.mode == Mode::kSlow && rule.n > 0) {
      for (int64_t at = 0; at < send && !stop_; at += rule.n) {
        const int64_t piece = std::min<int64_t>(rule.n, send - at);
        if (!SendAll(fd, body.data() + start + at, static_cast<size_t>(piece))) return;
        if (at + piece < send) std::this_thread::sleep_for(std::chrono::seconds(4));
      }
      return;
    }
    if (!SendAll(fd, body.data() + start, static_cast<size_t>(send))) return;
    if (rule.mode == Mode::kStall) {
      // Nothing more, until the client gives up (closes) or 30 s pass.
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!stop_ && std::chrono::steady_clock::now() < limit) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        char c;
        if (::recv(fd, &c, 1, 0) <= 0) break;
      }
    }
  }

  mutable std::mutex mu_;
  std::map<std::string, std::string> files_;
  std::map<std::string, Rule> rules_;
  std::vector<Request> requests_;
  std::vector<std::thread> conn_threads_;
  std::thread accept_thread_;
  std::atomic<bool> stop_{false};
  int listen_fd_ = -1;
  int port_ = 0;
};

// A 127.0.0.1 port with nothing listening (bound, then closed): connecting is refused.
inline int UnusedLocalPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_HTTP_TEST_SERVER_H_
