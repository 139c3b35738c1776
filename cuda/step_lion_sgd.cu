// Step kernels of Lion and SGD.
#include "cuda/step_launch.cuh"

namespace lowbit {
namespace cuda {

template void launch_step<Algo::Lion>(const StepArgs&, int64_t, void*);
template void launch_step<Algo::Sgd>(const StepArgs&, int64_t, void*);

template void launch_stats<Algo::Lion>(const ShapedArgs&, int64_t, void*);
template void launch_stats<Algo::Sgd>(const ShapedArgs&, int64_t, void*);

}  // namespace cuda
}  // namespace lowbit
