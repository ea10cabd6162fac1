/*
 * nccl_ref.c: the C reference of scripts/bench/bench_collectives.lua on GPUs: NCCL called directly.
 *
 *   mpiexec -n N build/nccl_ref [--min 1K] [--max 1G] [--ops all_gather,all_reduce,reduce_scatter]
 *                               [--dtype f32|f16|bf16] [--iters N] [--warmup N] [--csv FILE]
 *                               [--pool] [--mid-priority] [--end-event]
 *
 * What bench_collectives_ref.c is for the CPU backend (MPI), this is for the CUDA backend, in the
 * manner of nccl-tests: MPI starts the ranks and carries the ncclUniqueId, then each collective is
 * called back to back on one non-blocking stream. Everything else is bench_collectives.lua's, so that
 * the two tables compare like with like: the sizes (nccl-tests' "size": the whole gathered output of
 * all_gather, the whole input of reduce_scatter, the buffer of all_reduce and broadcast, one rank's send
 * buffer of all_to_all), the count rounding, the buffers (all_reduce and broadcast in place, the others
 * out of place), the iteration counts (bench_sizes.h: about 256 MiB per measurement, 10 to 1000 calls; a
 * tenth as many warm-up calls, 3 to 100, 1 from 16 MiB), and the timing rule: after a barrier, host
 * time from the first enqueue until the last call has completed, divided by the calls, the slowest
 * rank's. CUDA events bracket the same loop, and
 * their time is printed too (the device-only figure, without the host's start and wake-up latency), and
 * so is the host time of the enqueue loop alone per call ("enq": NCCL's host cost, while the device
 * keeps up; below the device time per call, the loop is device-bound).
 * algbw = size / time; busbw = algbw x (n-1)/n for all_gather, reduce_scatter and all_to_all, x 2(n-1)/n
 * for all_reduce, x 1 for broadcast (nccl-tests' factors). The CSV has bench_collectives.lua's columns
 * plus the event time. One GPU per rank, by local rank. Keep NCCL_NVLS_ENABLE=0 on the lent machines.
 */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nccl_ref_loop.h"

static int rank, nranks;

#define CUDA_OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
  fprintf(stderr, "[rank %d] %s failed: %s\n", rank, #call, cudaGetErrorString(e_)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define NCCL_OK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) { \
  fprintf(stderr, "[rank %d] %s failed: %s\n", rank, #call, ncclGetErrorString(r_)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

#include "bench_sizes.h"

static double bus_factor(int op) {
  double n = nranks;
  return op == NCCL_REF_AR ? 2 * (n - 1) / n : op == NCCL_REF_BC ? 1 : (n - 1) / n;
}

typedef struct bufs { char *a, *b; long count; size_t es; ncclDataType_t t; } bufs;

static void call(int op, const bufs *x, ncclComm_t comm, cudaStream_t st) {
  ncclResult_t r = nccl_ref_call(op, x->a, x->b, x->count, x->es, x->t, nranks, comm, st);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] %s (NCCL) failed: %s\n", rank, nccl_ref_names[op], ncclGetErrorString(r));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

int main(int argc, char **argv) {
  long min = 1L << 10, max = 1L << 30;
  int fixed_iters = 0, fixed_warmup = -1;
  const char *csv = NULL, *ops = "all_gather,all_reduce,reduce_scatter", *dtype = "f32";
  int pool = 0, prio_mid = 0, end_event = 0;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    /* --pool: buffers from cudaMallocAsync's pool, --mid-priority: the stream at the middle priority,
     * both as tpsh's CUDA backend does (to tell NCCL's cost on them from tpsh's own) */
    if (!strcmp(a, "--pool")) { pool = 1; i--; continue; }
    if (!strcmp(a, "--mid-priority")) { prio_mid = 1; i--; continue; }
    /* --end-event: an untimed event recorded after every call, as a Work's end event is in tpsh (and
     * in PyTorch's ProcessGroupNCCL): what the Work contract itself costs on top of NCCL */
    if (!strcmp(a, "--end-event")) { end_event = 1; i--; continue; }
    if (!strcmp(a, "--min")) min = parse_size(v);
    else if (!strcmp(a, "--max")) max = parse_size(v);
    else if (!strcmp(a, "--ops")) ops = v;
    else if (!strcmp(a, "--dtype")) dtype = v;
    else if (!strcmp(a, "--iters")) fixed_iters = atoi(v);
    else if (!strcmp(a, "--warmup")) fixed_warmup = atoi(v);
    else if (!strcmp(a, "--csv")) csv = v;
    else { fprintf(stderr, "nccl_ref: unknown argument %s\n", a); return 2; }
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  MPI_Comm node;
  int local = 0, ndev = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  CUDA_OK(cudaGetDeviceCount(&ndev));
  CUDA_OK(cudaSetDevice(local % ndev));

  bufs x = {0};
  x.t = ncclFloat32, x.es = 4;
  if (!strcmp(dtype, "f16")) x.t = ncclFloat16, x.es = 2;
  else if (!strcmp(dtype, "bf16")) x.t = ncclBfloat16, x.es = 2;
  else if (!strcmp(dtype, "f64")) x.t = ncclFloat64, x.es = 8;

  ncclUniqueId id;
  if (rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t st;
  int least = 0, greatest = 0;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_OK(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, prio_mid ? (least + greatest) / 2 : 0));
  cudaEvent_t e0, e1, done;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  size_t cap = (size_t)max + (size_t)nranks * x.es;      /* the largest rounded size, with slack */
  if (pool) {
    cudaMemPool_t mp;
    unsigned long long keep = ~0ull;
    CUDA_OK(cudaDeviceGetDefaultMemPool(&mp, local % ndev));
    CUDA_OK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));
    CUDA_OK(cudaMallocAsync((void **)&x.a, cap, st));
    CUDA_OK(cudaMallocAsync((void **)&x.b, cap, st));
    CUDA_OK(cudaStreamSynchronize(st));
  } else {
    CUDA_OK(cudaMalloc((void **)&x.a, cap));
    CUDA_OK(cudaMalloc((void **)&x.b, cap));
  }
  CUDA_OK(cudaMemset(x.a, 0, cap));
  CUDA_OK(cudaMemset(x.b, 0, cap));

  FILE *out = NULL;
  if (rank == 0) {
    int v = 0;
    ncclGetVersion(&v);
    if (csv && !(out = fopen(csv, "w"))) fprintf(stderr, "nccl_ref: cannot write %s\n", csv);
    if (out) fprintf(out, "collective,bytes,count,iters,time_us,algbw_GBps,busbw_GBps,event_us,enqueue_us\n");
    printf("# C NCCL reference (NCCL %d.%d.%d, one stream%s%s%s), %d ranks, dtype %s\n", v / 10000, v / 100 % 100,
           v % 100, pool ? ", pool memory" : "", prio_mid ? ", mid priority" : "",
           end_event ? ", an end event per call" : "", nranks, dtype);
    printf("%-15s %12s %12s %7s %12s %10s %10s %10s %10s\n", "collective", "size (B)", "count", "iters", "time (us)",
           "algbw GB/s", "busbw GB/s", "event (us)", "enq (us)");
  }
  for (int op = 0; op < NCCL_REF_NOPS; op++) {
    if (!strstr(ops, nccl_ref_names[op])) continue;
    for (long bytes = min; bytes <= max; bytes *= 2) {
      long count = bytes / (long)x.es;
      if (count < 1) count = 1;
      if (op == NCCL_REF_AG || op == NCCL_REF_RS || op == NCCL_REF_A2A) count = count - count % nranks < nranks ? nranks : count - count % nranks;
      x.count = count;
      long size = count * (long)x.es;
      for (int i = 0; i < warmup_for(size, fixed_warmup); i++) {
        call(op, &x, comm, st);
        if (end_event) CUDA_OK(cudaEventRecord(done, st));
      }
      CUDA_OK(cudaStreamSynchronize(st));
      MPI_Barrier(MPI_COMM_WORLD);
      int iters = iters_for(size, fixed_iters);
      double t0 = nccl_ref_now_ms();
      CUDA_OK(cudaEventRecord(e0, st));
      for (int i = 0; i < iters; i++) {
        call(op, &x, comm, st);
        if (end_event) CUDA_OK(cudaEventRecord(done, st));
      }
      double enq_ms = (nccl_ref_now_ms() - t0) / iters, worst_enq = 0;
      CUDA_OK(cudaEventRecord(e1, st));
      CUDA_OK(cudaEventSynchronize(e1));
      double ms = (nccl_ref_now_ms() - t0) / iters, worst = 0, worst_ev = 0;
      float ev = 0;
      CUDA_OK(cudaEventElapsedTime(&ev, e0, e1));
      double ev_ms = ev / iters;
      MPI_Reduce(&ms, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      MPI_Reduce(&ev_ms, &worst_ev, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      MPI_Reduce(&enq_ms, &worst_enq, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        double algbw = (double)size / (worst * 1e-3) / 1e9;
        printf("%-15s %12ld %12ld %7d %12.1f %10.3f %10.3f %10.1f %10.2f\n", nccl_ref_names[op], size, count, iters,
               worst * 1e3, algbw, algbw * bus_factor(op), worst_ev * 1e3, worst_enq * 1e3);
        if (out)
          fprintf(out, "%s,%ld,%ld,%d,%.3f,%.4f,%.4f,%.3f,%.3f\n", nccl_ref_names[op], size, count, iters, worst * 1e3,
                  algbw, algbw * bus_factor(op), worst_ev * 1e3, worst_enq * 1e3);
        fflush(stdout);
      }
    }
  }
  if (out) fclose(out);
  CUDA_OK(cudaStreamSynchronize(st));
  CUDA_OK(cudaFree(x.a));
  CUDA_OK(cudaFree(x.b));
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
