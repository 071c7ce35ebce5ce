/*
 * rt_comm_mpi_nompi.c - stands in for rt_comm_mpi.c in builds without MPI (the Makefile found
 * neither pkg-config ompi-c nor mpicc): rt_mpi.h's calls say "built without MPI"; a plain
 * `qshard` never reaches them, and under mpirun main refuses to start (rt_mpi_init).
 */
#include <stdlib.h> /* getenv */

#include "qs_log.h"
#include "rt_mpi.h"

static const char k_no_mpi[] = "this qshard was built without MPI: install libopenmpi-dev "
                               "openmpi-bin and rebuild (README, \"Several processes\")";

bool rt_mpi_built(void) { return false; }

/* Under mpirun all the same, so that main refuses instead of running N copies of a command. */
bool rt_mpi_launched(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

enum rt_err rt_mpi_init(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    qs_log_error(__func__, "%s", k_no_mpi);
    return RT_ERR_UNSUPPORTED;
}

void rt_mpi_finalize(void) {}
int rt_mpi_world(void) { return 0; }
int rt_mpi_rank(void) { return 0; }
int rt_mpi_local_rank(void) { return 0; }
int rt_mpi_local_size(void) { return 1; }
void rt_mpi_set_timeout(double seconds) { (void)seconds; }

enum rt_err rt_mpi_bcast(void *buf, size_t bytes, bool bounded, const char *what)
{
    (void)buf, (void)bytes, (void)bounded, (void)what;
    qs_log_error(__func__, "%s", k_no_mpi);
    return RT_ERR_UNSUPPORTED;
}

enum rt_err rt_mpi_gather(const void *send, size_t bytes, void *recv, const char *what)
{
    (void)send, (void)bytes, (void)recv, (void)what;
    qs_log_error(__func__, "%s", k_no_mpi);
    return RT_ERR_UNSUPPORTED;
}

void rt_mpi_abort(const char *why) { (void)why; }

enum rt_err rt_comm_mpi_create(enum rt_device device, int gpu, struct rt_comm **out)
{
    (void)device, (void)gpu;
    *out = NULL;
    qs_log_error(__func__, "%s", k_no_mpi);
    return RT_ERR_UNSUPPORTED;
}
