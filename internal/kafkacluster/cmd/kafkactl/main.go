// Command kafkactl acts on the cluster scripts/kafka-up.sh started:
//
//	kafkactl [-dir DIR] wait [-timeout 3m]   until the cluster is whole
//	kafkactl [-dir DIR] kill|stop|cont|start N
//	kafkactl [-dir DIR] leader TOPIC [PARTITION]
//	kafkactl [-dir DIR] restore              continue, start and wait
//
// DIR defaults to MILLRACE_KAFKA_DIR, else /tmp/millrace-kafka.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/millrace/millrace/internal/kafkacluster"
)

func main() {
	dir := flag.String("dir", kafkacluster.Dir(), "the cluster's directory")
	flag.Parse()
	if err := run(*dir, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "kafkactl:", err)
		os.Exit(1)
	}
}

func run(dir string, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: kafkactl [-dir DIR] wait|kill|stop|cont|start|leader|restore ...")
	}
	c, err := kafkacluster.Open(dir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node := func() (int, error) {
		if len(args) < 2 {
			return 0, fmt.Errorf("%s needs a node number", args[0])
		}
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 || n > len(c.Nodes()) {
			return 0, fmt.Errorf("node %q: want 1 to %d", args[1], len(c.Nodes()))
		}
		return n, nil
	}
	switch args[0] {
	case "wait":
		fs := flag.NewFlagSet("wait", flag.ContinueOnError)
		timeout := fs.Duration("timeout", 3*time.Minute, "how long to wait")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		wctx, wcancel := context.WithTimeout(ctx, *timeout)
		defer wcancel()
		return c.WaitHealthy(wctx)
	case "restore":
		return c.Restore(ctx)
	case "kill", "stop", "cont", "start":
		n, err := node()
		if err != nil {
			return err
		}
		switch args[0] {
		case "kill":
			return c.Kill(n)
		case "stop":
			return c.Stop(n)
		case "cont":
			return c.Cont(n)
		default:
			return c.Start(ctx, n)
		}
	case "leader":
		if len(args) < 2 {
			return fmt.Errorf("leader needs a topic")
		}
		ps, err := c.Partitions(ctx, args[1])
		if err != nil {
			return err
		}
		for _, p := range ps {
			if len(args) > 2 && strconv.Itoa(int(p.Partition)) != args[2] {
				continue
			}
			fmt.Printf("%s/%d leader=%d replicas=%v isr=%v\n", p.Topic, p.Partition, p.Leader, p.Replicas, p.ISR)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q", args[0])
}
