// Package polyglot holds the test of millrace across languages end to end
// (polyglot_test.go): a saga whose middle participant is a Python service
// (payments.py, built on the millrace package of python/), and events from
// a Go service's outbox to the Python service's inbox and back, through
// Kafka, under duplicate deliveries and restarts of the Python process.
// The test makes the Python environment with scripts/python-venv.sh.
package polyglot
