/* Test machines only: MLX's ring backend waits for its peer without spinning a core.

MLX's ring backend (mlx/distributed/ring/ring.cpp, SocketThread::worker, mlx 0.32) keeps its
sockets non-blocking and calls recv(2)/send(2) in a loop until the peer's bytes come: a rank
waiting for another burns a whole core for as long as it waits. On a Mac each rank has its
machine to itself and that buys latency; on a 2-core test machine running several test workers
the waiting rank takes the core the rank it waits for needs (measured: 3.0 CPU-s for a 3 s wait;
about an eighth of the whole suite's CPU went to it, perf record over one run).

Preloaded into the processes tests start (tests/conftest.py), this waits in ppoll(2) for the
socket to become ready, at most WAIT_NS, whenever a call *from libmlx* finds it not ready: the
same calls, the same bytes, the same errors, a wakeup as soon as the peer's data arrives, and
no effect on any other library's sockets (ZeroMQ's, Python's). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define WAIT_NS 200000 /* a send queued behind a waiting recv waits at most this long */

static int called_from_mlx(const void *caller) {
  /* MLX calls from a couple of places: their answers are kept (dladdr walks the link maps) */
  static const void *seen[8];
  static int answer[8];
  for (int i = 0; i < 8; i++) {
    const void *known = __atomic_load_n(&seen[i], __ATOMIC_ACQUIRE);
    if (!known) break;
    if (known == caller) return answer[i];
  }
  Dl_info info;
  int mlx = dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "libmlx");
  for (int i = 0; i < 8; i++)
    if (!seen[i]) {
      answer[i] = mlx; /* published before its caller: a reader never sees one without it */
      __atomic_store_n(&seen[i], caller, __ATOMIC_RELEASE); /* a race only repeats a lookup */
      break;
    }
  return mlx;
}

static void wait_ready(int fd, short events) {
  int saved = errno;
  struct pollfd poller = {fd, events, 0};
  struct timespec limit = {0, WAIT_NS};
  ppoll(&poller, 1, &limit, NULL);
  errno = saved;
}

ssize_t recv(int fd, void *buffer, size_t size, int flags) {
  static ssize_t (*next)(int, void *, size_t, int);
  if (!next) next = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
  ssize_t done = next(fd, buffer, size, flags);
  if (done < 0 && errno == EAGAIN && called_from_mlx(__builtin_return_address(0)))
    wait_ready(fd, POLLIN);
  return done;
}

ssize_t send(int fd, const void *buffer, size_t size, int flags) {
  static ssize_t (*next)(int, const void *, size_t, int);
  if (!next) next = (ssize_t (*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
  ssize_t done = next(fd, buffer, size, flags);
  if (done < 0 && errno == EAGAIN && called_from_mlx(__builtin_return_address(0)))
    wait_ready(fd, POLLOUT);
  return done;
}
