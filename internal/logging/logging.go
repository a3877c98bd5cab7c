// Package logging holds the one default logger of millrace's parts.
package logging

import (
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// Default is the logger of every millrace part whose config sets none:
// Watermill's slog adapter over slog.Default() as it is when called, with
// Watermill's Info level mapped to slog's Debug, so that by default errors
// (and warnings) are printed and routine lines are not.
func Default() watermill.LoggerAdapter {
	return watermill.NewSlogLoggerWithLevelMapping(nil, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
}
