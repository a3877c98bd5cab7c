//go:build race

package saga_test

// raceEnabled scales the heaviest tests down under the race detector,
// which slows this code about fivefold.
const raceEnabled = true
