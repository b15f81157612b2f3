//go:build !race

package httpguard_test

// raceSlowdown scales timing bounds under the race detector.
const raceSlowdown = 1
