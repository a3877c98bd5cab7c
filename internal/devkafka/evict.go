package devkafka

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// evictInterval is how often the broker looks for group members whose
// connection is gone.
const evictInterval = 500 * time.Millisecond

// evictor makes the broker evict a consumer-group member that died while
// joining, as Apache Kafka does when its session times out.
//
// kfake arms a member's session timer when its JoinGroup or SyncGroup reply
// has been handed to the connection, and when it heartbeats. A member killed
// while its JoinGroup waits for the rebalance gets its reply on a closed
// connection, about half the time too late for the hand-over, and then
// nothing arms its timer: it stays in the group forever, holding its
// partitions, and stalls every later rebalance for the rebalance timeout.
//
// The evictor watches the broker's connections and, for every member of a
// classic group whose connection (the one it joined on) is closed, sends
// one Heartbeat as that member, once per generation. That arms the session
// timer the reply should have armed; the member is evicted when it runs out,
// as in Kafka, unless it heartbeats itself, on another connection. A live
// member loses nothing by the extra heartbeat.
type evictor struct {
	cluster *kfake.Cluster
	stop    chan struct{}
	stopped chan struct{}

	mu      sync.Mutex
	open    map[string]int      // remote address -> connections open from it
	groups  map[string]struct{} // classic groups seen joining
	armed   map[string]bool     // members whose timer the evictor armed
	last    map[string]lastReq  // member id -> its last group request
	sending string              // member the evictor is sending a heartbeat as
	client  *kgo.Client
	clientE error
}

func newEvictor() *evictor {
	return &evictor{
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		open:    map[string]int{},
		groups:  map[string]struct{}{},
		armed:   map[string]bool{},
		last:    map[string]lastReq{},
	}
}

// listen is the broker's listen function: it counts the connections open
// from each remote address.
func (e *evictor) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &countingListener{Listener: ln, e: e}, nil
}

type countingListener struct {
	net.Listener
	e *evictor
}

func (l *countingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	addr := conn.RemoteAddr().String()
	l.e.mu.Lock()
	l.e.open[addr]++
	l.e.mu.Unlock()
	return &countedConn{Conn: conn, e: l.e, addr: addr}, nil
}

type countedConn struct {
	net.Conn
	e    *evictor
	addr string
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.e.mu.Lock()
		if c.e.open[c.addr]--; c.e.open[c.addr] <= 0 {
			delete(c.e.open, c.addr)
		}
		c.e.mu.Unlock()
	})
	return c.Conn.Close()
}

// lastReq is the last group request seen from a member.
type lastReq struct {
	key        kmsg.Key
	generation int32
}

// start begins watching cluster, whose listeners come from e.listen.
func (e *evictor) start(cluster *kfake.Cluster) {
	e.cluster = cluster
	observe := func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		var group, member string
		var generation int32
		switch req := kreq.(type) {
		case *kmsg.JoinGroupRequest:
			group, member = req.Group, req.MemberID
		case *kmsg.SyncGroupRequest:
			group, member, generation = req.Group, req.MemberID, req.Generation
		case *kmsg.HeartbeatRequest:
			group, member, generation = req.Group, req.MemberID, req.Generation
		case *kmsg.LeaveGroupRequest:
			group, member = req.Group, req.MemberID
		}
		e.mu.Lock()
		if group != "" && kreq.Key() == int16(kmsg.JoinGroup) {
			e.groups[group] = struct{}{}
		}
		if member != "" && !e.self(member) {
			e.last[member] = lastReq{key: kmsg.Key(kreq.Key()), generation: generation}
		}
		e.mu.Unlock()
		return nil, nil, false // observed only; kfake answers
	}
	for _, k := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup} {
		cluster.ControlKey(int16(k), observe)
	}
	go e.run()
}

// self reports whether the evictor is sending a request as member now.
// Called with e.mu held.
func (e *evictor) self(member string) bool { return e.sending == member }

// close stops the evictor; the cluster must still be running.
func (e *evictor) close() {
	close(e.stop)
	<-e.stopped
	if e.client != nil {
		e.client.Close()
	}
}

func (e *evictor) run() {
	defer close(e.stopped)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-e.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(evictInterval)
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-tick.C:
			e.sweep(ctx)
		}
	}
}

// orphan is a member whose connection is gone, with the generation its
// group is at.
type orphan struct {
	group      string
	generation int32
	member     kfake.GroupMember
}

// sweep arms the session timer of every member whose connection is gone and
// whose timer has not been armed at its group's current generation.
func (e *evictor) sweep(ctx context.Context) {
	e.mu.Lock()
	groups := make([]string, 0, len(e.groups))
	for g := range e.groups {
		groups = append(groups, g)
	}
	e.mu.Unlock()

	var orphans, keep []orphan
	present := map[string]bool{}
	for _, g := range groups {
		info := e.cluster.GroupInfo(g)
		e.mu.Lock()
		if info == nil {
			delete(e.groups, g)
			e.mu.Unlock()
			continue
		}
		for _, m := range info.Members {
			present[m.MemberID] = true
			if e.open[m.ClientHost] > 0 {
				if e.awaiting(info, m.MemberID) {
					keep = append(keep, orphan{group: g, generation: info.Epoch, member: m})
				}
				continue
			}
			if e.armed[m.MemberID] {
				continue
			}
			orphans = append(orphans, orphan{group: g, generation: info.Epoch, member: m})
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	for id := range e.armed {
		if !present[id] {
			delete(e.armed, id)
		}
	}
	for id := range e.last {
		if !present[id] {
			delete(e.last, id)
		}
	}
	e.mu.Unlock()

	for _, o := range keep {
		if ctx.Err() != nil {
			return
		}
		e.heartbeat(ctx, o)
	}

	for _, o := range orphans {
		if ctx.Err() != nil {
			return
		}
		if e.heartbeat(ctx, o) {
			e.mu.Lock()
			e.armed[o.member.MemberID] = true
			e.mu.Unlock()
		}
	}
}

// awaiting reports whether the member's last request is a JoinGroup or
// SyncGroup that the group is still answering, so that the member is
// waiting for its reply. Called with e.mu held.
func (e *evictor) awaiting(info *kfake.GroupInfo, member string) bool {
	l, ok := e.last[member]
	switch {
	case !ok:
		return false
	case info.State == "PreparingRebalance":
		return l.key == kmsg.JoinGroup
	case info.State == "CompletingRebalance":
		return l.key == kmsg.SyncGroup && l.generation == info.Epoch
	}
	return false
}

// heartbeat sends one Heartbeat as o's member and reports whether its
// session timer is now armed (or the member is gone, so that there is
// nothing left to arm).
func (e *evictor) heartbeat(ctx context.Context, o orphan) bool {
	if e.client == nil && e.clientE == nil {
		e.client, e.clientE = kgo.NewClient(kgo.SeedBrokers(e.cluster.ListenAddrs()...))
	}
	if e.clientE != nil {
		return false
	}
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = o.group
	req.Generation = o.generation
	req.MemberID = o.member.MemberID
	req.InstanceID = o.member.InstanceID
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e.mu.Lock()
	e.sending = o.member.MemberID
	e.mu.Unlock()
	resp, err := req.RequestWith(ctx, e.client)
	e.mu.Lock()
	e.sending = ""
	e.mu.Unlock()
	if err != nil {
		return false
	}
	switch kerr.ErrorForCode(resp.ErrorCode) {
	case nil, kerr.RebalanceInProgress, kerr.UnknownMemberID, kerr.FencedInstanceID:
		// Armed (kfake renews the session on a heartbeat that comes
		// in during a rebalance too), or the member is gone.
		return true
	}
	return false // ILLEGAL_GENERATION: a rebalance moved on; next sweep
}
