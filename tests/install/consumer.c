#include <lowbit.h>
#include <stdio.h>
int main(void) { printf("lowbit %d cuda %d mpi %d\n", lowbit_version(), lowbit_has_cuda(), lowbit_has_mpi()); return lowbit_version() == LOWBIT_VERSION ? 0 : 1; }
