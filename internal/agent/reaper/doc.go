// Package reaper owns the wait status of every child of the agent.
//
// The guest agent is PID 1, so every orphan in the guest becomes its child and
// must be reaped, or zombies pile up. One Reaper collects exit statuses:
// processes started through Start get their status delivered on a channel;
// statuses of any other child (orphans re-parented to PID 1) are dropped.
//
// Nothing else in the process may call wait4/waitid: exec.Cmd.Wait and
// os.Process.Wait would race with the reaper for statuses. Start processes
// with syscall.ForkExec inside Start instead.
//
// Two modes:
//   - PID 1 mode (Options.All): one goroutine waits for SIGCHLD and reaps
//     every exited child with wait4(-1, WNOHANG).
//   - Host mode (unit tests, or any process that is not PID 1): each started
//     pid gets its own waiter, which reaps only that pid, so children the
//     reaper does not own are left alone.
//
// In both modes a pid is reaped only while holding the reaper's mutex, and
// Signal sends signals under the same mutex, so a signal never reaches a
// recycled pid or process group.
package reaper
