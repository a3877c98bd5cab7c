// Command millrace-kafka runs millrace's embedded Kafka-protocol broker
// (franz-go's kfake) on a loopback port, for development and for examples
// that run in another process. It is not a production broker.
//
//	millrace-kafka -port 9092 -partitions 8 -data-dir /tmp/kafka
//
// With -data-dir it keeps its topics (auto-created ones included) and the
// records it acknowledged across restarts, also when it is killed with
// SIGKILL: a topic reaches the disk when it is created, records as they are
// acknowledged. A crash of the machine may lose the last records, which are
// not fsynced one by one. Without -data-dir everything is in memory.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/millrace/millrace/internal/devkafka"
)

func main() {
	var cfg devkafka.Config
	flag.IntVar(&cfg.Port, "port", 9092, "port to listen on at 127.0.0.1 (0: a free port)")
	flag.IntVar(&cfg.Partitions, "partitions", 8, "partitions of auto-created topics")
	flag.StringVar(&cfg.DataDir, "data-dir", "", "keep topics and acknowledged records here across restarts, SIGKILL included (not across a machine crash); default: memory only")
	flag.Parse()

	b, err := devkafka.Start(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The address goes to stdout alone, so scripts can read it.
	fmt.Println(b.Addrs()[0])
	fmt.Fprintf(os.Stderr, "millrace-kafka: embedded broker listening on %s; Ctrl-C to stop\n", b.Addrs()[0])

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	b.Close()
}
