// Package compensation is the participant side of sagas: the services that
// receive a saga's commands (reserve credit) and their compensations
// (release it), behind a barrier against duplicate, empty and late
// compensations. The full manual follows in this file.
package compensation
