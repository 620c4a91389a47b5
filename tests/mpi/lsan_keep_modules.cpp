// Linked into the mpirun test programs under AddressSanitizer only. Open MPI dlclose()s its MCA
// components in MPI_Finalize; memory they kept to the end is then reported by LeakSanitizer
// with "<unknown module>" frames that no suppression can name. Keeping the modules mapped (a
// no-op dlclose, interposed for the whole process) lets the report name them, so
// lsan_mpi.supp can suppress exactly Open MPI's own leaks and nothing of ubep's.
extern "C" int dlclose(void*) { return 0; }
