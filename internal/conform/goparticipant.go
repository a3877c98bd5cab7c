package conform

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/core"
)

// GoParticipantConfig configures RunGoParticipant.
type GoParticipantConfig struct {
	// Pool connects to the database. Required.
	Pool *pgxpool.Pool
	// Schema holds millrace's tables and conform_effect. Required.
	Schema string
	// Brokers are the Kafka brokers. Required.
	Brokers []string
	// Topic is the command topic. Required.
	Topic string
	// Name is the service's name: its consumer group and inbox consumer.
	// Defaults to "conform-" + Topic.
	Name string
}

// RunGoParticipant runs the Go participant of the conformance kit until
// ctx ends: a millrace.Service, wired as a user wires one with its
// defaults, whose compensation.Participant registers the conformance
// command (Register) and crashes the process at its crash point
// (CrashProcess).
func RunGoParticipant(ctx context.Context, cfg GoParticipantConfig) error {
	if cfg.Pool == nil || cfg.Schema == "" || len(cfg.Brokers) == 0 || cfg.Topic == "" {
		return fmt.Errorf("%w: conform: Pool, Schema, Brokers and Topic are required", core.ErrConfig)
	}
	if cfg.Name == "" {
		cfg.Name = "conform-" + cfg.Topic
	}
	svc, err := millrace.New(cfg.Pool, millrace.Config{Name: cfg.Name, Schema: cfg.Schema, Brokers: cfg.Brokers})
	if err != nil {
		return err
	}
	p, err := svc.AddParticipant(cfg.Name, cfg.Topic)
	if err == nil {
		err = Register(p, cfg.Schema, CrashProcess)
	}
	if err != nil {
		_ = svc.Close()
		return err
	}
	return svc.Run(ctx)
}
