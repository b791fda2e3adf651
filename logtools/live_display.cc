#include "logtools/live_display.h"

#include <errno.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>

#include "common/fd_io.h"

namespace pstrain::logtools {

LiveDisplay::LiveDisplay(int fd, std::chrono::milliseconds min_interval)
    : fd_(fd), min_interval_(min_interval) {}

bool LiveDisplay::IsTerminal(int fd, const Environment& env) {
  if (isatty(fd) != 1) return false;
  const std::optional<std::string> term = env.Get("TERM");
  return term.has_value() && *term != "dumb";
}

void LiveDisplay::Size(int* columns, int* rows) const {
  *columns = 80;
  *rows = 24;
  winsize ws = {};
  if (ioctl(fd_, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    *columns = ws.ws_col;
    *rows = ws.ws_row;
  }
}

size_t DisplayWidth(const std::string& line) {
  size_t width = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    if (c == 0x1b && i + 1 < line.size() && line[i + 1] == '[') {
      // CSI: parameters up to a final byte in 0x40..0x7e.
      for (i += 2; i < line.size() && (line[i] < 0x40 || line[i] > 0x7e); ++i) {
      }
      continue;
    }
    if ((c & 0xc0) != 0x80) ++width;  // not a UTF-8 continuation byte
  }
  return width;
}

bool LiveDisplay::Draw(const std::vector<std::string>& lines, bool force) {
  const auto now = std::chrono::steady_clock::now();
  int columns = 0, rows = 0;
  Size(&columns, &rows);
  const bool narrower = columns < drawn_columns_;
  if (!force && !narrower &&
      ((above_.empty() && lines == shown_) || now - last_draw_ < min_interval_)) {
    return false;
  }
  // The rows the block takes now: a terminal made narrower since it was
  // drawn has wrapped its longer lines onto more rows.
  size_t up = 0;
  if (drawn_ > 0) {
    for (const std::string& l : shown_) {
      up += std::max<size_t>(1, (DisplayWidth(l) + columns - 1) / static_cast<size_t>(columns));
    }
  }
  std::string out;
  // Cursor to the block's first line.
  if (up > 0) out += StrCat("\x1b[", up, "A");
  if (!above_.empty()) {
    // The block goes (clear to the end of the screen), the text takes its
    // place, and the block is drawn anew below it.
    out += "\r\x1b[J";
    for (auto& [fd, text] : above_) {
      if (fd != fd_) {
        WriteAll(fd_, out);
        out.clear();
        WriteAll(fd, text);
      } else {
        out += text;
      }
    }
    above_.clear();
    drawn_ = 0;
  }
  // Each line rewritten and cleared to its end; a shorter block clears what
  // is left below it.
  for (const std::string& l : lines) out += StrCat("\r", l, "\x1b[K\n");
  if (lines.size() < up) out += "\x1b[J";
  WriteAll(fd_, out);
  shown_ = lines;
  drawn_ = lines.size();
  drawn_columns_ = columns;
  last_draw_ = now;
  return true;
}

void LiveDisplay::PrintAbove(int out_fd, std::string text) {
  if (text.empty()) return;
  if (text.back() != '\n') text += '\n';
  above_.emplace_back(out_fd, std::move(text));
}

void LiveDisplay::Release() {
  if (!above_.empty()) Draw(shown_, true);
  drawn_ = 0;
  shown_.clear();
}

}  // namespace pstrain::logtools
