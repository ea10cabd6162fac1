/*
 * cuda_graph.c: tp.graph on the GPU: stream capture into a CUDA graph, and its launch (the vtable's
 * graph_begin, graph_end, graph_launch, graph_destroy; core/graph.c drives them).
 *
 * The capture is cudaStreamBeginCapture on the script's stream in cudaStreamCaptureModeThreadLocal, as
 * PyTorch's torch.cuda.graph takes it for NCCL users: only this thread is held to the capture's rules.
 * Global mode would refuse the "unsafe" calls of every thread while the capture is open (the watchdog's
 * and NCCL's own threads make CUDA calls), and relaxed mode would let this thread make a call that
 * breaks the capture; the core refuses those calls before they reach CUDA anyway (host reads, waits,
 * queries), with a message that names them. Other streams join the capture by cudaStreamWaitEvent on an
 * event recorded in it, which the core enqueues as it does outside a capture; NCCL captures its own
 * calls on a capturing stream (NCCL 2.9 on). Memory of the core's graph pool comes from tpsh_cuda_alloc
 * with no stream (cuda_memory.c: allocated and waited for on a stream that does not capture); the
 * kernels' scratch (a sum's partial results, a matmul's staging) stays cudaMallocAsync/cudaFreeAsync on
 * the capturing stream, which become the graph's own allocation and free nodes.
 *
 * The graph is instantiated once and uploaded on the capture's stream, so that the first replay costs
 * what the others do; the source graph is dropped at once (an executable graph does not need it).
 * Launches of one executable graph are ordered by CUDA, as the core orders its replays anyway.
 */
#include "backend/cuda/cuda_backend.h"

int tpsh_cuda_graph_begin(tpsh_stream *s) {
  CUDA_TRY(cudaStreamBeginCapture(tpsh_cuda_stream(s), cudaStreamCaptureModeThreadLocal));
  return TPSH_OK;
}

int tpsh_cuda_graph_end(tpsh_stream *s, int abort, void **exec) {
  *exec = NULL;
  cudaStream_t st = tpsh_cuda_stream(s);
  cudaGraph_t graph = NULL;
  /* Ends the capture on every stream that joined it, also when the capture was invalidated (a NULL
   * graph then) or a stream left unjoined (an error): the streams are as before in every case. */
  cudaError_t e = cudaStreamEndCapture(st, &graph);
  if (abort || e != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    if (abort) {
      (void)cudaGetLastError();
      return TPSH_OK;
    }
    return e != cudaSuccess ? tpsh_cuda_fail(e, "cudaStreamEndCapture")
                            : tpsh_error(TPSH_EBACKEND, "cudaStreamEndCapture returned no graph on rank %d (the "
                                         "capture was invalidated)", tpsh_rt.rank);
  }
  cudaGraphExec_t ex = NULL;
  e = cudaGraphInstantiateWithFlags(&ex, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return tpsh_cuda_fail(e, "cudaGraphInstantiateWithFlags");
  e = cudaGraphUpload(ex, st);
  if (e != cudaSuccess) {
    cudaGraphExecDestroy(ex);
    return tpsh_cuda_fail(e, "cudaGraphUpload");
  }
  *exec = ex;
  return TPSH_OK;
}

TPSH_HOT int tpsh_cuda_graph_launch(void *exec, tpsh_stream *s) {
  CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)exec, tpsh_cuda_stream(s)));
  return TPSH_OK;
}

/* A launch still in flight finishes first: CUDA frees an executable graph in flight once it completes. */
void tpsh_cuda_graph_destroy(void *exec) {
  if (exec && cudaGraphExecDestroy((cudaGraphExec_t)exec) != cudaSuccess) (void)cudaGetLastError();
}
