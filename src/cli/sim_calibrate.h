// `pagoda sim --calibrate`: times real engine steps on this machine (prefills of
// one request, batched prefills, decode steps at several batch sizes), fits the
// device entry's efficiencies and step overhead on the simulator's own cost
// formula (sim/calibrate.h), prints the fit and its residuals, and writes the
// three numbers into data/hardware.json (the rest of the file is left as it is).
#pragma once

namespace pagoda::cli {

// argv[0] is the subcommand name; "--calibrate" among the arguments is ignored.
int sim_calibrate_main(int argc, char** argv);

}  // namespace pagoda::cli
