package qemu

// rdtsc reads the time stamp counter (serialised by LFENCE).
func rdtsc() uint64

const haveRDTSC = true
