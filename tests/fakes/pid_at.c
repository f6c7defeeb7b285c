/* pid_at PID PROGRAM [ARGS...]: run PROGRAM as a new session leader whose pid is PID (so its process
 * group id is PID too), then wait for it. The tests use it to make an unrelated process take the
 * pid of a reaped vLLM leader. clone3() with set_tid (Linux 5.5+) needs CAP_SYS_ADMIN; it fails with
 * EEXIST (exit 17) when PID is in use, which includes a pid still held as a live group's id.
 * Prints the pid, then execs; exits with the program's status. Compiled by the tests at test time. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
  if (argc < 3) return 2;
  pid_t tid[1] = {(pid_t)atoi(argv[1])};
  struct clone_args a;
  memset(&a, 0, sizeof a);
  a.exit_signal = SIGCHLD;
  a.set_tid = (uint64_t)(uintptr_t)tid;
  a.set_tid_size = 1;
  long r = syscall(SYS_clone3, &a, sizeof a);
  if (r < 0) { int e = errno; perror("clone3"); return e == EEXIST ? 17 : 1; }
  if (r == 0) { setsid(); execvp(argv[2], argv + 2); perror("exec"); _exit(127); }
  printf("%ld\n", r);
  fflush(stdout);
  int status = 0;
  while (waitpid((pid_t)r, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
