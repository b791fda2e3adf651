// Clang thread-safety annotations; they expand to nothing on other compilers.
#ifndef PSTRAIN_COMMON_THREAD_ANNOTATIONS_H_
#define PSTRAIN_COMMON_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define PSTRAIN_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define PSTRAIN_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) PSTRAIN_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY PSTRAIN_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) PSTRAIN_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) PSTRAIN_THREAD_ANNOTATION_(pt_guarded_by(x))
#define REQUIRES(...) PSTRAIN_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define EXCLUSIVE_LOCKS_REQUIRED(...) REQUIRES(__VA_ARGS__)
#define ACQUIRE(...) PSTRAIN_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) PSTRAIN_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define EXCLUDES(...) PSTRAIN_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) PSTRAIN_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) PSTRAIN_THREAD_ANNOTATION_(assert_capability(x))
#define NO_THREAD_SAFETY_ANALYSIS PSTRAIN_THREAD_ANNOTATION_(no_thread_safety_analysis)

#endif  // PSTRAIN_COMMON_THREAD_ANNOTATIONS_H_
