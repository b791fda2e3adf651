// A block of status lines kept at the bottom of a terminal and redrawn in
// place (ANSI: cursor up, carriage return, clear line), with other output
// printed above it. Used by `pstrain launch` and `pstrain top` for the live
// view of a job (job_view.h).
//
// The block is redrawn at most once per `min_interval` (unless forced) and
// only when it changed, or at once when the terminal became narrower. Lines
// longer than the terminal are the caller's to cut (RenderJobView does, to the
// width of the moment); a terminal narrowed after a draw rewraps the block's
// lines, and the next redraw counts the rows they take at the new width (as
// terminals that reflow on resize show them).
// Everything is written with write(2), unbuffered, so output of the caller's
// own on another descriptor of the same terminal keeps its place as long as it
// goes through PrintAbove.
//
// Thread-compatible: one thread at a time.
#ifndef PSTRAIN_LOGTOOLS_LIVE_DISPLAY_H_
#define PSTRAIN_LOGTOOLS_LIVE_DISPLAY_H_

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/env.h"

namespace pstrain::logtools {

// The columns `line` takes on a terminal: its characters (UTF-8 continuation
// bytes and CSI escape sequences take none).
size_t DisplayWidth(const std::string& line);

class LiveDisplay {
 public:
  // Draws on `fd` (not owned).
  explicit LiveDisplay(int fd,
                       std::chrono::milliseconds min_interval = std::chrono::milliseconds(250));

  // Whether `fd` is a terminal that understands the escapes: isatty, and TERM
  // set and not "dumb".
  static bool IsTerminal(int fd, const Environment& env);

  // The terminal's size now (TIOCGWINSZ); 80 x 24 when it cannot be read.
  void Size(int* columns, int* rows) const;

  // Replaces the block by `lines`, first writing the text queued by
  // PrintAbove, when `force`, or when there is text queued or the lines differ
  // from what is shown, and the last redraw is at least min_interval old.
  // Returns whether it drew.
  bool Draw(const std::vector<std::string>& lines, bool force = false);

  // Queues `text` (whole lines) for `out_fd`: the next redraw erases the
  // block, writes it, and draws the block again below it. (So a process that
  // writes many lines costs one redraw per min_interval, not one per line.)
  void PrintAbove(int out_fd, std::string text);

  // Writes the text still queued (and the block below it), then leaves the
  // block as it is: what is written next goes below it.
  void Release();

 private:
  int fd_;
  std::chrono::milliseconds min_interval_;
  std::chrono::steady_clock::time_point last_draw_;
  std::vector<std::string> shown_;                  // the block on the screen now
  size_t drawn_ = 0;                                // how many lines of it are on the screen
  int drawn_columns_ = 0;                           // the terminal's width when it was drawn
  std::vector<std::pair<int, std::string>> above_;  // queued by PrintAbove: (fd, text)
};

}  // namespace pstrain::logtools

#endif  // PSTRAIN_LOGTOOLS_LIVE_DISPLAY_H_
