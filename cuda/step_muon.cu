// Step kernels of Muon's momentum (its output goes to the Newton-Schulz
// workspace, not to the param: the fast loops of dispatch_fast_muon).
#include "cuda/step_launch.cuh"

namespace lowbit {
namespace cuda {

template void launch_step<Algo::Muon>(const StepArgs&, int64_t, void*);
template void launch_stats<Algo::Muon>(const ShapedArgs&, int64_t, void*);

}  // namespace cuda
}  // namespace lowbit
