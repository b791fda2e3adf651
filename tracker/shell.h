// Quoting for the command lines the ssh launcher sends: every word is quoted,
// so values with spaces, quotes or '$' arrive intact and nothing is expanded.
#ifndef PSTRAIN_TRACKER_SHELL_H_
#define PSTRAIN_TRACKER_SHELL_H_

#include <string>
#include <string_view>
#include <vector>

namespace pstrain::tracker {

// A POSIX shell word that stands for exactly `s`: 'it'\''s' for it's.
std::string ShellQuote(std::string_view s);
// The words quoted and joined by single spaces.
std::string ShellJoin(const std::vector<std::string>& words);
// The same for people to read: only the words a shell would split or expand
// are quoted ("salloc --nodes=2 'a b'").
std::string ShellJoinReadable(const std::vector<std::string>& words);

}  // namespace pstrain::tracker

#endif  // PSTRAIN_TRACKER_SHELL_H_
