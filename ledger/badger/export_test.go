package badger

// Names for power_test.go (package badger_test), whose harness re-executes this test
// binary as its worker processes.
const (
	// powerWorkerEnv is jepsen.WorkerEnv, set in every worker process (this package's
	// tests cannot import evals/jepsen, which imports this package).
	powerWorkerEnv = "TOOLFENCE_JEPSEN_WORKER"
	// PlantEnv in a worker's environment names the bug TestMain plants there (plant).
	PlantEnv         = "TOOLFENCE_BADGER_PLANT"
	PlantSkipWALSync = plantSkipWALSync
)
