/* ULFM probe (docs/ELASTIC.md, "Transport"): do survivors of a lost host outlive it under Open MPI
 * 5 with --with-ft ulfm? Every rank loops on MPI_Barrier with MPI_ERRORS_RETURN; on the first
 * error a survivor revokes, shrinks, and runs one barrier on the shrunk communicator. Prints per
 * survivor: the CLOCK_REALTIME of the error (the driver subtracts the kill time), the error class,
 * and the shrunk size. Not part of the library: built only by tools/ulfm_probe/run.sh. */
#include <mpi.h>
#include <mpi-ext.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  char host[64];
  gethostname(host, sizeof host);
  printf("ready rank %d host %s pid %d\n", rank, host, (int)getpid());
  fflush(stdout);
  double end = now_s() + 60.0;
  long iters = 0;
  int rc = MPI_SUCCESS;
  while (now_s() < end) {
    rc = MPI_Barrier(MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) break;
    ++iters;
  }
  double t_err = now_s();
  int cls = 0;
  MPI_Error_class(rc, &cls);
  if (rc == MPI_SUCCESS) {
    printf("rank %d: no failure seen in 60 s (%ld barriers)\n", rank, iters);
    MPI_Finalize();
    return 1;
  }
  MPIX_Comm_revoke(MPI_COMM_WORLD);
  MPI_Comm shrunk;
  int src = MPIX_Comm_shrink(MPI_COMM_WORLD, &shrunk);
  int nsize = -1, brc = -1;
  if (src == MPI_SUCCESS) {
    MPI_Comm_size(shrunk, &nsize);
    MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN);
    brc = MPI_Barrier(shrunk);
  }
  double t_done = now_s();
  printf("survivor rank %d host %s err_at %.6f class %d (proc_failed=%d revoked=%d) shrink_rc %d "
         "shrunk_size %d barrier_rc %d done_at %.6f after %ld barriers\n",
         rank, host, t_err, cls, MPIX_ERR_PROC_FAILED, MPIX_ERR_REVOKED, src, nsize, brc, t_done,
         iters);
  fflush(stdout);
  if (src == MPI_SUCCESS) MPI_Comm_free(&shrunk);
  MPI_Finalize();
  printf("rank %d finalized at %.6f\n", rank, now_s());
  fflush(stdout);
  return 0;
}
