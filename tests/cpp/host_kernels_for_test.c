/* Host kernels for the simulated accelerator's kernel launches (hal_conformance_kernel_test.cpp): built
 * as a shared library that flagos_module_load opens. Parameters are read from the launch's buffer at their
 * natural alignment, as a CUDA kernel reads its parameters. */
#include <flagos/hal.h>

/* Appends the program's (x, y, z) to ids[3 * count .. 3 * count + 2] and counts it: the call order. */
struct fill_program_ids_params {
  unsigned int* ids;
  unsigned int* count;
};

FLAGOS_HAL_API void fill_program_ids(const flagos_host_kernel_context_t* context, const void* params) {
  const struct fill_program_ids_params* p = (const struct fill_program_ids_params*)params;
  unsigned int* slot = p->ids + 3 * (*p->count)++;
  slot[0] = context->program_id[0];
  slot[1] = context->program_id[1];
  slot[2] = context->program_id[2];
}

/* y[i] += a * x[i] for the 64 elements of program x below n. */
#define AXPY_BLOCK 64
struct axpy_f32_params {
  const float* x;
  float* y;
  float a;
  int n;
};

FLAGOS_HAL_API void axpy_f32(const flagos_host_kernel_context_t* context, const void* params) {
  const struct axpy_f32_params* p = (const struct axpy_f32_params*)params;
  const int begin = (int)context->program_id[0] * AXPY_BLOCK;
  for (int i = begin; i < begin + AXPY_BLOCK && i < p->n; ++i) p->y[i] += p->a * p->x[i];
}
