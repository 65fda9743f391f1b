// `wan_study model ...`: the performance model's command line (tools/wan_study/model.h).
#pragma once

namespace softrdma::wan_model {

/// Runs `wan_study model <kv|train|tables> [options]` with argv[0] = "model":
///   kv      one KV hand-off prediction, a CSV header and row on stdout;
///   train   one training-step prediction, a CSV header and row on stdout;
///   tables  every table of the study into --out DIR (CSV files), a summary on stdout.
/// Returns the exit status: 0, 2 on bad options (message on stderr), 1 when a file cannot
/// be written.
int model_main(int argc, char** argv);

}  // namespace softrdma::wan_model
