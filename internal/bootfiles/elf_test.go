package bootfiles

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"testing"
)

// fakeELF describes a tiny ELF64 file built by buildELF.
type fakeELF struct {
	typ     elf.Type    // ET_EXEC or ET_REL
	class   elf.Class   // ELFCLASS64 unless set
	machine elf.Machine // EM_X86_64 unless set
	notes   []byte      // PT_NOTE segment contents, if any
	interp  string      // PT_INTERP contents, if any
	modinfo []byte      // .modinfo section contents, if any
	padding int         // extra zero bytes (to make a larger payload)
}

// note encodes one ELF note.
func note(name string, typ uint32, desc []byte) []byte {
	var b bytes.Buffer
	nm := append([]byte(name), 0)
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(nm)))
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(desc)))
	_ = binary.Write(&b, binary.LittleEndian, typ)
	b.Write(nm)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(desc)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	return b.Bytes()
}

func pvhNote() []byte { return note(pvhNoteName, pvhNoteType, []byte{0, 0, 0, 1}) }

// buildELF returns the bytes of a minimal ELF64 little-endian file that
// debug/elf can parse.
func buildELF(t testing.TB, f fakeELF) []byte {
	t.Helper()
	if f.class == 0 {
		f.class = elf.ELFCLASS64
	}
	if f.machine == 0 {
		f.machine = elf.EM_X86_64
	}
	if f.typ == 0 {
		f.typ = elf.ET_EXEC
	}
	const ehsize, phsize, shsize = 64, 56, 64

	type seg struct {
		typ  elf.ProgType
		data []byte
	}
	var segs []seg
	if f.notes != nil {
		segs = append(segs, seg{elf.PT_NOTE, f.notes})
	}
	if f.interp != "" {
		segs = append(segs, seg{elf.PT_INTERP, append([]byte(f.interp), 0)})
	}

	var body bytes.Buffer // everything after the program headers
	dataOff := uint64(ehsize + phsize*len(segs))
	var progs []elf.Prog64
	for _, s := range segs {
		progs = append(progs, elf.Prog64{
			Type: uint32(s.typ), Off: dataOff + uint64(body.Len()),
			Filesz: uint64(len(s.data)), Memsz: uint64(len(s.data)), Align: 4,
		})
		body.Write(s.data)
	}

	var sects []elf.Section64
	shstrndx := 0
	if f.modinfo != nil {
		shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
		modOff := dataOff + uint64(body.Len())
		body.Write(f.modinfo)
		strOff := dataOff + uint64(body.Len())
		body.Write(shstr)
		sects = []elf.Section64{
			{},
			{Name: 1, Type: uint32(elf.SHT_PROGBITS), Flags: uint64(elf.SHF_ALLOC), Off: modOff, Size: uint64(len(f.modinfo)), Addralign: 1},
			{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(shstr)), Addralign: 1},
		}
		shstrndx = 2
	}
	body.Write(make([]byte, f.padding))
	for body.Len()%8 != 0 {
		body.WriteByte(0)
	}
	shoff := uint64(0)
	if len(sects) > 0 {
		shoff = dataOff + uint64(body.Len())
	}

	var out bytes.Buffer
	h := elf.Header64{
		Type: uint16(f.typ), Machine: uint16(f.machine), Version: 1,
		Phoff: ehsize, Shoff: shoff, Ehsize: ehsize,
		Phentsize: phsize, Phnum: uint16(len(progs)),
		Shentsize: shsize, Shnum: uint16(len(sects)), Shstrndx: uint16(shstrndx),
	}
	if len(progs) == 0 {
		h.Phoff = 0
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS] = byte(f.class)
	h.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	h.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	mustWrite(t, &out, h)
	for _, p := range progs {
		mustWrite(t, &out, p)
	}
	out.Write(body.Bytes())
	for _, s := range sects {
		mustWrite(t, &out, s)
	}
	return out.Bytes()
}

func mustWrite(t testing.TB, b *bytes.Buffer, v any) {
	t.Helper()
	if err := binary.Write(b, binary.LittleEndian, v); err != nil {
		t.Fatal(err)
	}
}

// modinfoBytes encodes .modinfo key=value pairs.
func modinfoBytes(kv ...string) []byte {
	var b bytes.Buffer
	for _, s := range kv {
		b.WriteString(s)
		b.WriteByte(0)
	}
	return b.Bytes()
}

func TestBuildELFParses(t *testing.T) {
	b := buildELF(t, fakeELF{notes: pvhNote(), modinfo: modinfoBytes("name=x")})
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if f.Section(".modinfo") == nil || len(f.Progs) != 1 {
		t.Fatalf("sections %v progs %d", f.Sections, len(f.Progs))
	}
}
