/* finalize.h: MPI_Finalize, ended with `code` after TPSH_FINALIZE_TIMEOUT seconds if it hangs. */
#ifndef TPSH_HOST_FINALIZE_H
#define TPSH_HOST_FINALIZE_H
void tpsh_finalize_bounded(int rank, int code);
#endif
