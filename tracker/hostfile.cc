#include "tracker/hostfile.h"

#include <fstream>
#include <sstream>

namespace pstrain::tracker {

StatusOr<std::vector<Host>> ParseHostList(const std::string& text, const std::string& origin) {
  std::vector<Host> hosts;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    Host h;
    std::string where = StrCat(origin, ":", lineno);
    std::string port;
    // "user@" first, so that "me@[::1]:2222" is a user on an IPv6 host.
    std::string user;
    if (const size_t at = word.find('@'); word[0] != '[' && at != std::string::npos) {
      user = word.substr(0, at + 1);
      word = word.substr(at + 1);
      if (word.empty()) {
        return Status::InvalidArgument(StrCat(where, ": no host after '", user, "'"));
      }
    }
    if (word[0] == '[') {
      size_t close = word.find(']');
      if (close == std::string::npos) {
        return Status::InvalidArgument(StrCat(where, ": unterminated '[' in host '", word, "'"));
      }
      h.name = word.substr(1, close - 1);
      if (close + 1 < word.size()) {
        if (word[close + 1] != ':') {
          return Status::InvalidArgument(
              StrCat(where, ": expected ':port' after ']' in '", word, "'"));
        }
        port = word.substr(close + 2);
      }
    } else {
      size_t colon = word.find(':');
      if (colon != std::string::npos && word.find(':', colon + 1) != std::string::npos) {
        return Status::InvalidArgument(StrCat(where, ": '", word,
                                              "' looks like an IPv6 address: write it in "
                                              "brackets, [addr] or [addr]:port"));
      }
      h.name = word.substr(0, colon);
      if (colon != std::string::npos) port = word.substr(colon + 1);
    }
    if (h.name.empty() || h.name[0] == '-' || user.rfind('-', 0) == 0) {
      return Status::InvalidArgument(StrCat(where, ": bad host name '", user, h.name, "'"));
    }
    h.name = user + h.name;
    if (!port.empty() || word.back() == ':') {
      char* end = nullptr;
      long p = std::strtol(port.c_str(), &end, 10);
      if (port.empty() || *end != '\0' || p < 1 || p > 65535) {
        return Status::InvalidArgument(
            StrCat(where, ": port '", port, "' of host '", h.name, "' is not in 1..65535"));
      }
      h.port = static_cast<int>(p);
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) return Status::InvalidArgument(StrCat(origin, ": no hosts listed"));
  return hosts;
}

StatusOr<std::vector<Host>> ReadHostFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(StrCat("cannot open host file '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseHostList(ss.str(), path);
}

bool IsLoopbackHost(const std::string& name) {
  return name == "localhost" || name == "::1" || name.rfind("127.", 0) == 0;
}

}  // namespace pstrain::tracker
