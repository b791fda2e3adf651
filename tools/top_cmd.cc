// pstrain top LOG_DIR: the live view of a job (logtools/job_view.h) from its
// logs: <LOG_DIR>/launch.log and <LOG_DIR>/<role>-<rank>.log, as `pstrain
// launch` writes them. On a terminal it follows the job until the job ends,
// q is pressed, or Ctrl-C; --once prints one frame and exits.
#include <errno.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <poll.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/env.h"
#include "logtools/job_view.h"
#include "logtools/live_display.h"
#include "tools/commands.h"

DEFINE_bool(once, false, "print one frame of the view and exit (for scripts)");
DEFINE_int32(interval_ms, 500, "how often the logs are read again while following the job");
DEFINE_int32(timeout_s, 0,
             "stop following after this many seconds: print the view and exit 124 (a job whose "
             "launcher died on another host never writes its end); 0: until the job ends");

namespace pstrain {
namespace {

int g_top_stop_pipe[2] = {-1, -1};  // the signal handler writes the signal number here

void OnTopSignal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (write(g_top_stop_pipe[1], &b, 1) < 0) {
    // The pipe is full: a stop is already pending.
  }
  errno = saved;
}

std::string Title(const logtools::JobView& view, const std::string& dir, bool has_events) {
  std::string title = view.job_id().empty() ? dir : StrCat("job ", view.job_id(), " in ", dir);
  if (!has_events) return title + ": no launch.log, so the states are unknown";
  if (!view.ended()) return title + ": running";
  return StrCat(title, view.ended_ok() ? ": finished: " : ": failed: ", view.end_text());
}

// The launcher of a job on this host that has gone without writing its end:
// the job is over.
void CheckLauncher(logtools::JobView* view, logtools::JobLogFollower* follower) {
  if (view->ended() || view->launcher_pid() <= 0) return;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  if (view->launcher_host() != host) return;
  if (kill(view->launcher_pid(), 0) == 0 || errno != ESRCH) return;
  // It may have written its end just before exiting.
  if (follower->Poll(view).ok() && view->ended()) return;
  view->MarkLauncherGone(StrCat("the launcher (pid ", view->launcher_pid(),
                                ") is gone without a summary: it was killed"));
}

// Puts the terminal on stdin in a mode where one key press can be read (no
// line editing, no echo), and back at the end.
class KeyReader {
 public:
  KeyReader() {
    if (isatty(0) != 1 || tcgetattr(0, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    active_ = tcsetattr(0, TCSANOW, &raw) == 0;
  }
  ~KeyReader() {
    if (active_) tcsetattr(0, TCSANOW, &saved_);
  }
  bool active() const { return active_; }

 private:
  termios saved_ = {};
  bool active_ = false;
};

void PrintFrame(const std::vector<std::string>& lines) {
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  std::fflush(stdout);
}

}  // namespace

int RunTop(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: pstrain top LOG_DIR [--once] [--interval-ms MS] [--timeout-s S]\n");
    return 2;
  }
  if (FLAGS_interval_ms < 50 || FLAGS_interval_ms > 60000) {
    std::fprintf(stderr, "pstrain top: --interval-ms %d is not in [50, 60000]\n",
                 FLAGS_interval_ms);
    return 2;
  }
  if (FLAGS_timeout_s < 0) {
    std::fprintf(stderr, "pstrain top: --timeout-s %d is negative\n", FLAGS_timeout_s);
    return 2;
  }
  const Deadline deadline =
      FLAGS_timeout_s > 0 ? Deadline::In(std::chrono::seconds(FLAGS_timeout_s)) : Deadline::Never();
  const std::string dir = argv[1];
  logtools::JobLogFollower follower(dir);
  logtools::JobView view;
  if (Status s = follower.Poll(&view); !s.ok()) {
    std::fprintf(stderr, "pstrain top: %s\n", s.ToString().c_str());
    return 1;
  }
  if (!follower.has_events() && view.processes().empty()) {
    std::fprintf(stderr,
                 "pstrain top: '%s' has neither launch.log nor <role>-<rank>.log files: not a "
                 "job directory of pstrain launch\n",
                 dir.c_str());
    return 1;
  }
  CheckLauncher(&view, &follower);
  const bool tty = logtools::LiveDisplay::IsTerminal(1, Environment());
  logtools::LiveDisplay display(1);
  auto frame = [&](bool in_place) {
    int columns = 0, rows = 0;
    display.Size(&columns, &rows);
    return logtools::RenderJobView(view, tty ? columns - 1 : 0, in_place ? rows - 1 : 0,
                                   Title(view, dir, follower.has_events()));
  };
  // Without a terminal there is nothing to show until the end, and without
  // launch.log no end to wait for.
  if (FLAGS_once || (!tty && (view.ended() || !follower.has_events()))) {
    PrintFrame(frame(false));
    return 0;
  }

  if (pipe2(g_top_stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("pstrain top: pipe");
    return 1;
  }
  struct sigaction sa = {};
  sa.sa_handler = OnTopSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);

  KeyReader keys;
  int exit_code = 0;
  if (tty) display.Draw(frame(true), true);
  constexpr int kTimedOut = 124;  // as timeout(1)
  while (!view.ended()) {
    if (deadline.Expired()) {
      exit_code = kTimedOut;
      break;
    }
    pollfd fds[2] = {{g_top_stop_pipe[0], POLLIN, 0}, {0, POLLIN, 0}};
    const nfds_t count = keys.active() ? 2 : 1;
    const int wait_ms =
        static_cast<int>(std::min<int64_t>(FLAGS_interval_ms, deadline.RemainingMillis()));
    if (poll(fds, count, wait_ms) > 0) {
      unsigned char sig = 0;
      if ((fds[0].revents & POLLIN) != 0 && read(g_top_stop_pipe[0], &sig, 1) == 1) {
        exit_code = 128 + sig;
        break;
      }
      char key = 0;
      if (count == 2 && (fds[1].revents & (POLLIN | POLLHUP)) != 0) {
        if (read(0, &key, 1) != 1 || key == 'q' || key == 'Q') break;
      }
    }
    if (Status s = follower.Poll(&view); !s.ok()) {
      if (tty) display.Release();
      std::fprintf(stderr, "pstrain top: %s\n", s.ToString().c_str());
      return 1;
    }
    CheckLauncher(&view, &follower);
    if (tty) display.Draw(frame(true));
  }
  if (tty) {
    display.Draw(frame(true), true);
    display.Release();
  } else {
    PrintFrame(frame(false));
  }
  if (exit_code == kTimedOut) {
    std::fprintf(stderr, "pstrain top: the job had not ended after --timeout-s %d\n",
                 FLAGS_timeout_s);
  }
  return exit_code;
}

}  // namespace pstrain
