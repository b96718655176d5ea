package kvevents_test

import (
	"fmt"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
)

// A subscriber splits each ZMQ message and decodes its payload; here the
// message is built with AppendSeq and AppendBatch, as the simulated engines
// publish it.
func ExampleDecodeBatch() {
	published := kvevents.Batch{TS: 1789095808.5, DPRank: 0, Events: []kvevents.Event{{
		Kind: kvevents.BlockStored, BlockHashes: []kvevents.Hash{0xdab89baa7b5857c0},
		TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, LoRAID: -1, Medium: "GPU", GroupIdx: 0, SlidingWindow: -1,
	}}}
	frames := [][]byte{
		[]byte("kv@10.0.0.7@qwen"),
		kvevents.AppendSeq(nil, 41),
		kvevents.AppendBatch(nil, published, kvevents.EncodingMap),
	}

	topic, seq, payload, err := kvevents.ParseMessage(frames)
	if err != nil {
		fmt.Println(err)
		return
	}
	b, err := kvevents.DecodeBatch(payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s seq %d rank %d dropped %d unknown %d\n", topic, seq, b.DPRank, b.Dropped, b.Unknown)
	for _, ev := range b.Events {
		fmt.Printf("%v %#x: %d tokens in blocks of %d on %s\n", ev.Kind, ev.BlockHashes, len(ev.TokenIDs), ev.BlockSize, ev.Medium)
	}
	// Output:
	// kv@10.0.0.7@qwen seq 41 rank 0 dropped 0 unknown 0
	// BlockStored [0xdab89baa7b5857c0]: 4 tokens in blocks of 4 on GPU
}

// The end of a replay is a message whose seq is -1.
func ExampleParseReplayReply() {
	for _, frames := range [][][]byte{
		{kvevents.AppendSeq(nil, 7), []byte("payload")},
		{kvevents.AppendSeq(nil, kvevents.ReplayEndSeq), {}},
	} {
		seq, payload, end, err := kvevents.ParseReplayReply(frames)
		fmt.Println(seq, len(payload), end, err)
	}
	// Output:
	// 7 7 false <nil>
	// 18446744073709551615 0 true <nil>
}
