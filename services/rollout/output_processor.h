#ifndef TANDEM_SERVICES_ROLLOUT_OUTPUT_PROCESSOR_H_
#define TANDEM_SERVICES_ROLLOUT_OUTPUT_PROCESSOR_H_

#include "services/rollout/generation_work.h"
#include "services/rollout/sample_output.h"
#include "tandem/rollout/v1/rollout.pb.h"

namespace tandem::rollout {

// The front end's output processor: the GenerateResponse of `output`, a sample of `work`. It
// names the sample and its prompt, decodes the text of a text prompt's answer with the served
// model's codec, and carries every error as valid UTF-8.
rollout::v1::GenerateResponse ToGenerateResponse(const GenerationWork& work,
                                                 const SampleOutput& output);

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_OUTPUT_PROCESSOR_H_
