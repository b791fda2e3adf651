// How the scheduler tells the launcher which process a failed job should be
// blamed on. The first process to exit is often not it: after a server stops
// answering, the scheduler ends the job and exits first. So the scheduler
// writes one line holding kJobCauseMarker, then the process's name as the
// launcher names it ("server-0", "worker-3", "scheduler-0"), ": " and why;
// the launcher's summary names that process (tracker/supervisor.h).
#ifndef PSTRAIN_COMMON_JOB_CAUSE_H_
#define PSTRAIN_COMMON_JOB_CAUSE_H_

#include <string>

namespace pstrain {

inline constexpr char kJobCauseMarker[] = "job failed; cause: ";

// "server-0" for ("server", 0).
inline std::string JobProcessName(const std::string& role, int rank) {
  return role + "-" + std::to_string(rank);
}

// Finds the marker in `line`: *name and *why get what follows it. False when
// the line has none.
inline bool ParseJobCause(const std::string& line, std::string* name, std::string* why) {
  const size_t at = line.find(kJobCauseMarker);
  if (at == std::string::npos) return false;
  const size_t start = at + sizeof(kJobCauseMarker) - 1;
  const size_t colon = line.find(": ", start);
  if (colon == std::string::npos || colon == start) return false;
  *name = line.substr(start, colon - start);
  if (name->find(' ') != std::string::npos) return false;
  *why = line.substr(colon + 2);
  while (!why->empty() && (why->back() == '\n' || why->back() == '\r')) why->pop_back();
  return true;
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_JOB_CAUSE_H_
