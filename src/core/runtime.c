/*
 * runtime.c: start-up and shut-down of the core: which backend, which rank and device, the default
 * stream and the world group. MPI itself is initialised by the host (src/host/main.c), which owns the
 * process; the core only asks MPI who it is.
 */
#include "core/backend.h"
#include "core/internal.h"
#include "core/alloc.h"
#include "core/check.h"
#include "core/stream.h"
#include "core/work.h"
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#ifndef TPSH_VERSION
#define TPSH_VERSION "0.1.0"
#endif

tpsh_runtime tpsh_rt;

int tpsh_world_init(void);
void tpsh_world_shutdown(void);
#ifdef TPSH_WITH_CUDA
int tpsh_cuda_device_count(void);
#endif

int tpsh_gpu_count(void) {
#ifdef TPSH_WITH_CUDA
  return tpsh_cuda_device_count();
#else
  return 0;
#endif
}

static const tpsh_backend *pick_backend(const char *name) {
  if (!name || !*name) {
#ifdef TPSH_WITH_CUDA
    if (tpsh_cuda_device_count() > 0) return &tpsh_backend_cuda;
#endif
    return &tpsh_backend_cpu;
  }
  if (strcmp(name, "cpu") == 0) return &tpsh_backend_cpu;
  if (strcmp(name, "cuda") == 0) {
#ifdef TPSH_WITH_CUDA
    if (tpsh_cuda_device_count() <= 0)
      return tpsh_error_null(TPSH_EINVAL, "--backend cuda: no CUDA device is visible on this host");
    return &tpsh_backend_cuda;
#else
    return tpsh_error_null(TPSH_EINVAL, "--backend cuda: this tpsh was built without the CUDA backend "
                                        "(configure with -DTPSH_CUDA=ON where the CUDA toolkit is installed)");
#endif
  }
  return tpsh_error_null(TPSH_EINVAL, "unknown backend '%s': expected cpu or cuda", name);
}

int tpsh_init(const char *backend, int device) {
  if (tpsh_rt.initialized) return tpsh_error(TPSH_EINVAL, "tpsh is already initialised");
  int mpi_ok = 0;
  MPI_Initialized(&mpi_ok);
  if (!mpi_ok) return tpsh_error(TPSH_EINVAL, "MPI must be initialised before tpsh_init");
  const tpsh_backend *be = pick_backend(backend);
  if (!be) return TPSH_EINVAL;
  MPI_Comm_rank(MPI_COMM_WORLD, &tpsh_rt.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &tpsh_rt.size);
  /* The local rank (the rank among processes of this host) picks the GPU. */
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, tpsh_rt.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &tpsh_rt.local_rank);
  MPI_Comm_size(node, &tpsh_rt.local_size);
  MPI_Comm_free(&node);
  /* The CPU backend has no devices to choose: --device 99 taken without a word would let a script that
   * meant a GPU run on the host. 0 is taken, so that one command line serves both backends. */
  if (be == &tpsh_backend_cpu && device > 0)
    return tpsh_error(TPSH_EINVAL, "--device %d: the CPU backend has no devices (--device picks a GPU of the "
                      "CUDA backend; 0 is taken on both)", device);
  tpsh_rt.be = be;
  tpsh_rt.device = device;
  int rc = be->init(device < 0 ? tpsh_rt.local_rank : device);
  if (rc) return rc;
  if (be == &tpsh_backend_cpu) tpsh_rt.device = -1;
  tpsh_alloc_init();
  tpsh_rt.initialized = 1;
  tpsh_rt.default_stream = tpsh_stream_create_default();
  if (!tpsh_rt.default_stream) { tpsh_rt.initialized = 0; return TPSH_EBACKEND; }
  rc = tpsh_world_init();
  if (rc) { tpsh_rt.initialized = 0; return rc; }
  rc = tpsh_watchdog_start();           /* collective: dups the world for its own messages */
  if (rc) { tpsh_rt.initialized = 0; return rc; }
  return TPSH_OK;
}

void tpsh_shutdown(void) {
  if (!tpsh_rt.initialized) return;
  tpsh_graph_abort();                   /* a capture the script never ended (os.exit inside tp.graph) */
  /* A script's end and each test of `tpsh test` raise an asynchronous error still noted; past them it
   * can only be said (the ranks have agreed on their exit status already). */
  if (tpsh_synchronize() == TPSH_ECOMM && tpsh_async_error_check() == TPSH_ECOMM)
    fprintf(stderr, "[rank %d] tpsh: at shut-down, an asynchronous error that no call raised: %s\n", tpsh_rt.rank,
            tpsh_last_error());
  tpsh_world_shutdown();
  tpsh_alloc_shutdown();                /* every storage is gone: the cache goes back, its streams go */
  tpsh_stream *d = tpsh_rt.default_stream;
  tpsh_rt.default_stream = NULL;
  tpsh_stream_release(d);
  tpsh_work_shutdown();
  tpsh_event_pool_drain();
  tpsh_rt.be->shutdown();
  tpsh_watchdog_stop();                 /* last: the waits above are still watched */
  tpsh_rt.initialized = 0;
}

const char *tpsh_backend_name(void) { return tpsh_rt.be ? tpsh_rt.be->name : "none"; }
int tpsh_rank(void) { return tpsh_rt.rank; }
int tpsh_size(void) { return tpsh_rt.size; }
int tpsh_local_rank(void) { return tpsh_rt.local_rank; }
int tpsh_device(void) { return tpsh_rt.device; }

TPSH_HOT static double clock_ms(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

double tpsh_now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

/* The same clock at the kernel tick's resolution (a few ms), cheaper than a full read (which costs
 * 0.04 us on the GPU machine): for stamps taken on every collective and read in seconds. */
TPSH_HOT double tpsh_now_coarse_ms(void) { return clock_ms(CLOCK_MONOTONIC_COARSE); }

const char *tpsh_versions(void) {
  static char buf[1024];
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  char *nl = strchr(mpi, '\n');      /* the first line says what a bug report needs */
  if (nl) *nl = 0;
  const char *cpu = tpsh_backend_cpu.versions();
#ifdef TPSH_WITH_CUDA
  const char *cuda = tpsh_backend_cuda.versions();
#else
  const char *cuda = "CUDA: backend not built; NCCL: not built (cmake -DTPSH_CUDA=OFF, or no CUDA toolkit found)";
#endif
  snprintf(buf, sizeof buf, "tpsh %s\nMPI: %.300s\n%.300s\n%.300s", TPSH_VERSION, mpi, cpu, cuda);   /* one line each, cut to fit */
  return buf;
}
