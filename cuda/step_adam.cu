// Step kernels of the Adam family (AdamW, Adam with L2 decay).
#include "cuda/step_launch.cuh"

namespace lowbit {
namespace cuda {

template void launch_step<Algo::AdamW>(const StepArgs&, int64_t, void*);
template void launch_step<Algo::Adam>(const StepArgs&, int64_t, void*);

template void launch_stats<Algo::AdamW>(const ShapedArgs&, int64_t, void*);
template void launch_stats<Algo::Adam>(const ShapedArgs&, int64_t, void*);

}  // namespace cuda
}  // namespace lowbit
