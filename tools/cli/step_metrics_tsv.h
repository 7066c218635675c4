#ifndef TANDEM_TOOLS_CLI_STEP_METRICS_TSV_H_
#define TANDEM_TOOLS_CLI_STEP_METRICS_TSV_H_

#include <string>

#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::cli {

// StepMetrics as tab-separated values for plotting and analysis (gnuplot's columnheaders,
// pandas.read_csv(sep="\t")): a header naming every field as trainer.proto does, then one row
// per step (10 significant digits). Fields come from the descriptor, so a new metric needs no
// change.
std::string StepMetricsTsvHeader();
std::string StepMetricsTsvRow(const trainer::v1::StepMetrics& metrics);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_CLI_STEP_METRICS_TSV_H_
