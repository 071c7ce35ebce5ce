/*
 * rt_mpi.h - one process per tensor-parallel rank (docs/DESIGN.md section 12): the MPI world of
 * this process, host messages between the processes with a deadline, and the communicator of
 * this process's one rank over MPI_COMM_WORLD (rt_backend.h struct rt_comm): "mpi-cpu" (host
 * collectives through MPI) or "mpi-nccl" (device collectives through NCCL, whose id rank 0 makes
 * and broadcasts over MPI).
 *
 * Built from runtime/rt_comm_mpi.c when the build finds MPI (Makefile: pkg-config ompi-c or
 * mpicc), else runtime/rt_comm_mpi_nompi.c, whose calls say "built without MPI".
 *
 * Lifetime: main calls rt_mpi_init only when rt_mpi_launched() (so a plain `qshard` never
 * touches MPI) and rt_mpi_finalize before it returns. Every other call is made by one thread at
 * a time (MPI_THREAD_SERIALIZED: the server's engine thread steps the model).
 *
 * Time bound: every collective inside a step and of the start-up handshake waits at most the
 * timeout (rt_mpi_set_timeout, default 30 s); then this rank prints a message naming itself and
 * the collective and ends the whole job (MPI_Abort, exit code 3). A follower waiting for the
 * next step waits without a bound (a server may be idle for hours); a rank that dies is seen by
 * mpirun, which ends the job.
 *
 * Test: tests/test_mpi.sh (mpirun -np 2 and 4 on the CPU: equal to TP-1, failures bounded).
 */
#ifndef QS_RT_MPI_H
#define QS_RT_MPI_H

#include <stdbool.h>
#include <stddef.h>

#include "rt_backend.h" /* struct rt_comm, enum rt_err, enum rt_device */

#ifdef __cplusplus
extern "C" {
#endif

#define RT_MPI_DEFAULT_TIMEOUT_S 30.0

/* Whether this build has MPI. */
bool rt_mpi_built(void);
/* Whether an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK in
 * the environment). Makes no MPI call. */
bool rt_mpi_launched(void);
/*
 * MPI_Init_thread (SERIALIZED), then this process's rank, world size and local rank (its index
 * among the processes of its node: MPI_COMM_TYPE_SHARED split). Errors: RT_ERR_UNSUPPORTED
 * (built without MPI), RT_ERR_THREAD (the MPI library cannot give SERIALIZED).
 */
enum rt_err rt_mpi_init(int *argc, char ***argv);
/* MPI_Finalize when rt_mpi_init succeeded; else nothing. */
void rt_mpi_finalize(void);
/* World size (0 when MPI is not initialised), rank, local rank, processes on this node. */
int rt_mpi_world(void);
int rt_mpi_rank(void);
int rt_mpi_local_rank(void);
int rt_mpi_local_size(void);
/* Seconds a collective inside a step or the handshake may wait (> 0); default 30. */
void rt_mpi_set_timeout(double seconds);

/*
 * Host broadcast of rank 0's buf[bytes] to every process. bounded: at most the timeout (else the
 * job ends, see above); !bounded: no limit (a follower waiting for the next step). `what` names
 * the message in the timeout report.
 */
enum rt_err rt_mpi_bcast(void *buf, size_t bytes, bool bounded, const char *what);
/* Host gather: rank r's send[bytes] lands at recv + r * bytes on rank 0 (recv [world][bytes],
 * rank 0 only); bounded. */
enum rt_err rt_mpi_gather(const void *send, size_t bytes, void *recv, const char *what);
/* Print "rank R: giving up: why" and end every process of the job (MPI_Abort, exit 3). Does not
 * return when MPI is initialised. */
void rt_mpi_abort(const char *why);

/*
 * The communicator endpoint of this process's rank (rt_mpi_rank of rt_mpi_world):
 * device RT_DEVICE_CPU: host collectives (all_reduce = MPI all-gather, then the sum in rank
 * order in fp32 as ref_allreduce_sum: every rank the same bits, those of rt_comm_local_create);
 * RT_DEVICE_CUDA: NCCL on GPU `gpu` (ncclCommInitRank with rank 0's id broadcast over MPI;
 * all-reduce by ncclAllReduce, gather by ncclSend/ncclRecv to rank 0). broadcast: MPI from rank
 * 0; abort: rt_mpi_abort. Errors: RT_ERR_UNSUPPORTED (no MPI), RT_ERR_NOMEM, RT_ERR_DEVICE,
 * RT_ERR_NO_DEVICE (NCCL set-up, a build without CUDA).
 */
enum rt_err rt_comm_mpi_create(enum rt_device device, int gpu, struct rt_comm **out);

/* --- the executor across processes (runtime/rt_exec.c) ------------------------------------------
 * Under MPI with world > 1, rt_exec_open on rank 0 drives rank 0 only: it sends the path and its
 * options (device resolved) to the other processes, which wait in rt_exec_follow; the world of
 * the model must equal the MPI world (else RT_ERR_ARG naming both); every rank checks its file
 * against rank 0's manifest and config, then opens it (GPU: rt_opts.cuda_device + local rank);
 * any failure makes every rank refuse, rank 0 naming each failing rank and its file. */

/*
 * A process of rank > 0: follow rank 0's models until rank 0 ends the job (rt_exec_mpi_end),
 * opening each model rank 0 opens and running its steps; nothing is printed but messages.
 * *code: rank 0's exit code. Errors: RT_ERR_UNSUPPORTED (no MPI); a failed collective ends the
 * job (rt_mpi_abort).
 */
enum rt_err rt_exec_follow(int *code);
/* Rank 0 (main, on every way out, after every rt_exec is freed): end the followers' wait with
 * exit code `code`. Nothing outside MPI or at world 1. */
void rt_exec_mpi_end(int code);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_MPI_H */
