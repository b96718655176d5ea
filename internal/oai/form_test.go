package oai

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"strings"
	"testing"
)

const formCT = "multipart/form-data; boundary=XyZ"

// crlf turns the LFs of s into CRLFs, for readable bodies.
func crlf(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }

// transcriptionBody is a transcription request as curl -F sends it
// (boundary XyZ), model after the file.
var transcriptionBody = crlf(`--XyZ
Content-Disposition: form-data; name="file"; filename="speech.wav"
Content-Type: audio/wav

RIFF$` + "\x00\x00\x00" + `WAVEfmt 
--XyZ
Content-Disposition: form-data; name="model"

openai/whisper-large-v3
--XyZ
Content-Disposition: form-data; name="language"

en
--XyZ--
`)

func TestParseForm(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		fileField string
		want      Form // ModelStart/End are checked by value below
	}{
		{"curl, model after the file", transcriptionBody, "file", Form{Model: "openai/whisper-large-v3", HasFile: true}},
		{"model first, stream true", crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nwhisper\n--XyZ\nContent-Disposition: form-data; name=\"stream\"\n\nTRUE\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a.mp3\"\n\nID3\n--XyZ--"), "file", Form{Model: "whisper", HasFile: true, Stream: true}},
		{"stream false", crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ\nContent-Disposition: form-data; name=\"stream\"\n\nfalse\n--XyZ--\n"), "file", Form{HasFile: true}},
		{"no model", crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ--\n"), "file", Form{HasFile: true}},
		{"empty model", crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\n\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ--\n"), "file", Form{HasFile: true}},
		{"last model wins", crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nfirst\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nsecond\n--XyZ--\n"), "file", Form{Model: "second", HasFile: true}},
		{"empty file with a filename", crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"empty.wav\"\n\n\n--XyZ--\n"), "file", Form{HasFile: true}},
		{"file content without a filename", crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"\n\nbytes\n--XyZ--\n"), "file", Form{HasFile: true}},
		{"other file field", crlf("--XyZ\nContent-Disposition: form-data; name=\"audio\"; filename=\"a\"\n\nx\n--XyZ--\n"), "audio", Form{HasFile: true}},
		{"no file required", crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZ--\n"), "", Form{Model: "m"}},
		{"bare LF line endings", "--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\r\n--XyZ--\n", "file", Form{Model: "m", HasFile: true}},
		{"preamble and epilogue", "This is a preamble.\r\n--not the boundary\r\n" + crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ--\nThis is the epilogue.\n--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nignored\n"), "file", Form{Model: "m", HasFile: true}},
		{"transport padding", crlf("--XyZ \t\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZ  \nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ-- \t\n"), "file", Form{Model: "m", HasFile: true}},
		{"boundary-like lines in content", crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZa\n--XyZ-x\n--Xy\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ--"), "file", Form{Model: "m\r\n--XyZa\r\n--XyZ-x\r\n--Xy", HasFile: true}},
		{"header folding and case", crlf("--XyZ\ncontent-disposition: form-data;\n\tname=\"model\"\nCONTENT-TYPE: text/plain\n\nm\n--XyZ\nContent-Disposition:form-data; name=file; filename=a.wav\n\nx\n--XyZ--\n"), "file", Form{Model: "m", HasFile: true}},
		{"rfc 2231 name", crlf("--XyZ\nContent-Disposition: form-data; name*=UTF-8''model\n\nm\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename*=UTF-8''%C3%A9.wav\n\nx\n--XyZ--\n"), "file", Form{Model: "m", HasFile: true}},
		{"empty part at a boundary", crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ--\n"), "file", Form{HasFile: true}},
		{"identity transfer encodings", crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\nContent-Transfer-Encoding: 8bit\n\nm\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\nContent-Transfer-Encoding: base64\n\nx\n--XyZ--\n"), "file", Form{Model: "m", HasFile: true}},
		{"no parts but the end", "--XyZ--", "", Form{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			got, err := ParseForm(body, formCT, tt.fileField)
			if err != nil {
				t.Fatalf("ParseForm() error = %v", err)
			}
			if got.ModelEnd > 0 || got.ModelStart > 0 {
				if got.ModelStart <= 0 || string(body[got.ModelStart:got.ModelEnd]) != got.Model {
					t.Errorf("model span [%d:%d] is not the model %q", got.ModelStart, got.ModelEnd, got.Model)
				}
			}
			tt.want.ModelStart, tt.want.ModelEnd = got.ModelStart, got.ModelEnd
			if got != tt.want {
				t.Errorf("ParseForm() = %+v\nwant %+v", got, tt.want)
			}
			if strings.Contains(tt.body, `name="model"`) && got.ModelStart == 0 {
				t.Errorf("model part present, span 0")
			}
			ref, err := refParseForm(body, "XyZ", tt.fileField)
			if err != nil || ref.strict || string(ref.model) != got.Model || ref.hasFile != got.HasFile {
				t.Errorf("mime/multipart: model %q, file %v, strict %v, error %v", ref.model, ref.hasFile, ref.strict, err)
			}
		})
	}
}

// TestParseFormReplaceModel: the offsets let the gateway swap the model
// and still have a form that reads back with the new one.
func TestParseFormReplaceModel(t *testing.T) {
	body := []byte(transcriptionBody)
	f, err := ParseForm(body, formCT, "file")
	if err != nil {
		t.Fatal(err)
	}
	out := append(append(append([]byte(nil), body[:f.ModelStart]...), "large-v3-turbo"...), body[f.ModelEnd:]...)
	g, err := ParseForm(out, formCT, "file")
	if err != nil || g.Model != "large-v3-turbo" || !g.HasFile {
		t.Fatalf("after replacing: %+v, %v", g, err)
	}
	if ref, err := refParseForm(out, "XyZ", "file"); err != nil || string(ref.model) != "large-v3-turbo" {
		t.Errorf("mime/multipart after replacing: %q, %v", ref.model, err)
	}
}

func TestParseFormErrors(t *testing.T) {
	ok := crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ--\n")
	part := func(name, value string) string {
		return crlf("--XyZ\nContent-Disposition: form-data; name=\"" + name + "\"\n\n" + value + "\n")
	}
	tests := []struct {
		name          string
		ct, body      string
		status        int
		param, errmsg string
	}{
		{"no content type", "", ok, 415, "", "content type must be multipart/form-data"},
		{"json", "application/json", ok, 415, "", "content type must be multipart/form-data"},
		{"urlencoded", "application/x-www-form-urlencoded", ok, 415, "", "content type must be multipart/form-data"},
		{"multipart mixed", "multipart/mixed; boundary=XyZ", ok, 415, "", "content type must be multipart/form-data"},
		{"garbage content type", "multipart/form-data/x", ok, 415, "", "content type must be multipart/form-data"},
		{"bad parameters", "multipart/form-data; boundary", ok, 400, "", "malformed content type: mime: invalid media parameter"},
		{"no boundary", "multipart/form-data", ok, 400, "", "content type has no multipart boundary"},
		{"empty boundary", `multipart/form-data; boundary=""`, ok, 400, "", "content type has no multipart boundary"},
		{"empty body", formCT, "", 400, "", "malformed multipart body: unexpected end of body"},
		{"no boundary in body", formCT, "just text\r\n", 400, "", "malformed multipart body: unexpected end of body"},
		{"unterminated part", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"\n\nx\n"), 400, "", "malformed multipart body: part is not closed by a boundary"},
		{"no final boundary", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"\n\nx\n--XyZ"), 400, "", "malformed multipart body: unexpected end of body"},
		{"headers cut off", formCT, "--XyZ\r\nContent-Disposition: form-data; name=\"file\"", 400, "", "malformed multipart body: unexpected end of part headers"},
		{"header without colon", formCT, crlf("--XyZ\nContent-Disposition form-data\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: part header line without a colon"},
		{"header starts with space", formCT, crlf("--XyZ\n Content-Disposition: form-data; name=\"file\"\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: part header starts with white space"},
		{"space before colon", formCT, crlf("--XyZ\nContent-Disposition : form-data; name=\"model\"\nContent-Disposition: form-data; name=\"file\"\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: invalid part header name"},
		{"control byte in header", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"\x01\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: invalid part header value"},
		{"two content-dispositions", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"\ncontent-disposition: form-data; name=\"model\"\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: more than one content-disposition in a part"},
		{"no content-disposition", formCT, crlf("--XyZ\nContent-Type: text/plain\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: part without content-disposition"},
		{"bad content-disposition", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"; name=\"x\"\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: invalid content-disposition: mime: duplicate parameter name"},
		{"attachment", formCT, crlf("--XyZ\nContent-Disposition: attachment; name=\"file\"\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: content-disposition is not form-data"},
		{"junk after a part", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"\n\nx\n--XyZ junk\n--XyZ--\n"), 400, "", "malformed multipart body: expected a boundary line after a part"},
		{"lf boundary in crlf mode", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"file\"\n\nx\n") + "--XyZ\n" + crlf("Content-Disposition: form-data; name=\"a\"\n\nx\n--XyZ--\n"), 400, "", "malformed multipart body: expected a boundary line after a part"},
		{"no file part", formCT, part("model", "m") + "--XyZ--\r\n", 400, "file", "file is required"},
		{"file part empty", formCT, part("file", "") + "--XyZ--\r\n", 400, "file", "file is required"},
		{"model too long", formCT, part("model", strings.Repeat("m", 257)) + ok, 400, "model", "model must be at most 256 bytes"},
		{"stream yes", formCT, part("stream", "yes") + ok, 400, "stream", "stream must be true or false"},
		{"stream empty", formCT, part("stream", "") + ok, 400, "stream", "stream must be true or false"},
		{"stream non-ascii fold", formCT, part("stream", "fal\u017fe") + ok, 400, "stream", "stream must be true or false"},
		{"stream padded", formCT, part("stream", "true ") + ok, 400, "stream", "stream must be true or false"},
		{"model quoted-printable", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\nContent-Transfer-Encoding: quoted-printable\n\nm=3Dx\n") + ok, 400, "model", "model must not be transfer-encoded"},
		{"stream base64", formCT, crlf("--XyZ\nContent-Disposition: form-data; name=\"stream\"\ncontent-transfer-encoding:  BASE64\n\ndHJ1ZQ==\n") + ok, 400, "stream", "stream must not be transfer-encoded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseForm([]byte(tt.body), tt.ct, "file")
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("ParseForm() = %+v, %v; want a *RequestError", f, err)
			}
			if re.HTTPStatus() != tt.status || re.Param != tt.param || re.Message != tt.errmsg {
				t.Errorf("error = {Status:%d Param:%q Message:%q}, want {%d %q %q}", re.HTTPStatus(), re.Param, re.Message, tt.status, tt.param, tt.errmsg)
			}
			if tt.status == 400 && re.Status != 0 {
				t.Errorf("Status = %d, want 0 for 400", re.Status)
			}
			if f != (Form{}) {
				t.Errorf("form = %+v, want zero on error", f)
			}
		})
	}
	// At the cap is fine.
	body := part("model", strings.Repeat("m", 256)) + ok
	if f, err := ParseForm([]byte(body), formCT, "file"); err != nil || len(f.Model) != 256 {
		t.Errorf("256-byte model: %d bytes, %v", len(f.Model), err)
	}
}

// refForm is what mime/multipart reads from a form: the last model and
// stream values, whether the file is there, and whether a part breaks a
// rule ParseForm adds (strict): a header name with a space, other than
// exactly one Content-Disposition, or one that mime.ParseMediaType rejects
// or that is not form-data. encoded names a model or stream part with a
// transfer encoding, the first one.
type refForm struct {
	model, stream []byte
	hasFile       bool
	strict        bool
	encoded       string
}

// errRefTruncated is refParseForm's error for a body that ends inside a
// part's headers.
var errRefTruncated = errors.New("body ends in a part's headers")

// refParseForm reads body with mime/multipart's NextRawPart (no
// Content-Transfer-Encoding decoding, like ParseForm).
//
// NextRawPart also returns a bare io.EOF when the body ends inside a
// part's headers (textproto's error passes through), which looks like the
// end of the form. So a read counts as a success only if the body with a
// blank line appended, in either line ending, reads to the end too: after
// the closing boundary line the addition is epilogue, or completes that
// line, while in headers it ends them and leaves a part without a
// boundary.
func refParseForm(body []byte, boundary, fileField string) (refForm, error) {
	f, err := refReadForm(body, boundary, fileField)
	if err != nil {
		return f, err
	}
	_, crlfErr := refReadForm(append(bytes.Clone(body), "\r\n\r\n"...), boundary, fileField)
	_, lfErr := refReadForm(append(bytes.Clone(body), "\n\n"...), boundary, fileField)
	if crlfErr != nil && lfErr != nil {
		return f, errRefTruncated
	}
	return f, nil
}

// refReadForm is refParseForm without the check for a truncated body.
func refReadForm(body []byte, boundary, fileField string) (refForm, error) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var f refForm
	for {
		p, err := mr.NextRawPart()
		if err == io.EOF {
			return f, nil
		}
		if err != nil {
			return f, err
		}
		content, err := io.ReadAll(p)
		if err != nil {
			return f, err
		}
		for k := range p.Header {
			if strings.Contains(k, " ") {
				f.strict = true
			}
		}
		cds := p.Header.Values("Content-Disposition")
		if len(cds) != 1 {
			f.strict = true
			continue
		}
		if disp, _, err := mime.ParseMediaType(cds[0]); err != nil || disp != "form-data" {
			f.strict = true
			continue
		}
		switch name := p.FormName(); name {
		case "model", "stream":
			for _, cte := range p.Header.Values("Content-Transfer-Encoding") {
				switch strings.ToLower(cte) {
				case "7bit", "8bit", "binary":
				default:
					if f.encoded == "" {
						f.encoded = name
					}
				}
			}
			if name == "model" {
				f.model = content
			} else {
				f.stream = content
			}
		}
		if fileField != "" && p.FormName() == fileField && (p.FileName() != "" || len(content) > 0) {
			f.hasFile = true
		}
	}
}

// fuzzBoundaries are the boundaries FuzzParseForm picks from: short, long,
// with a space, and one made of dashes, whose delimiter overlaps itself.
var fuzzBoundaries = []string{"XyZ", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "a b", "-", "b"}

// FuzzParseForm checks that ParseForm never panics, that its errors are
// *RequestErrors and its model offsets point at its model, and that,
// whenever mime/multipart reads the same body without an error, ParseForm
// finds the same model, file and stream flag, or rejects the body for
// exactly the reason that reading gives.
func FuzzParseForm(f *testing.F) {
	for _, s := range []string{
		transcriptionBody,
		crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZ\nContent-Disposition: form-data; name=\"stream\"\n\ntrue\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a.mp3\"\n\nID3\n--XyZ--"),
		"--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\r\n--XyZ--\n",
		"preamble\r\n" + crlf("--XyZ \nContent-Disposition: form-data;\n name=\"model\"\n\nm\n--XyZa\n--XyZ\nContent-Disposition: form-data; name=file\n\n--XyZ-- \nepilogue"),
		crlf("--XyZ\nContent-Disposition : form-data; name=\"model\"\n\nm\n--XyZ--\n"),
		crlf("--XyZ\nContent-Disposition: form-data; name=\"model\"\nContent-Disposition: form-data; name=\"x\"\n\nm\n--XyZ--\n"),
		crlf("--a b\nContent-Disposition: form-data; name=\"model\"\n\nm\n--a b\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\n\n\n--a b--\n"),
		crlf("---\nContent-Disposition: form-data; name=\"model\"\n\n----\n-----\nContent-Disposition: form-data; name=\"file\"\n\nx\n-----\n"),
		"--XyZ--", "", "--XyZ\r\n\r\n--XyZ--",
	} {
		f.Add(uint8(0), []byte(s))
	}
	f.Add(uint8(0x80), []byte("--XyZ\nContent-Disposition: form-data; name=\"model\"\n\nm\n--XyZ\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nx\n--XyZ--\n"))
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		if which&0x80 != 0 {
			// Mutations of LF-only forms, read as CRLF forms.
			body = bytes.ReplaceAll(body, []byte("\n"), []byte("\r\n"))
		}
		boundary := fuzzBoundaries[int(which&0x7f)%len(fuzzBoundaries)]
		got, err := ParseForm(body, `multipart/form-data; boundary="`+boundary+`"`, "file")
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) || re.HTTPStatus() != 400 || got != (Form{}) {
				t.Fatalf("ParseForm(%q) = %+v, %v; want a zero Form and a 400 *RequestError", body, got, err)
			}
		} else if got.ModelStart != 0 || got.ModelEnd != 0 {
			if got.ModelStart <= 0 || got.ModelEnd > len(body) || string(body[got.ModelStart:got.ModelEnd]) != got.Model {
				t.Fatalf("ParseForm(%q) = %+v: the span is not the model", body, got)
			}
		}
		ref, referr := refParseForm(body, boundary, "file")
		if referr != nil {
			return // ParseForm may accept what mime/multipart rejects
		}
		var param string
		switch {
		case ref.strict || ref.encoded != "":
			// ParseForm may find either problem first.
			if err == nil {
				t.Fatalf("ParseForm(%q) = %+v; mime/multipart reads a part ParseForm must reject", body, got)
			}
			return
		case len(ref.model) > maxFormModel:
			param = "model"
		case ref.stream != nil && strings.ToLower(string(ref.stream)) != "true" && strings.ToLower(string(ref.stream)) != "false":
			param = "stream"
		case !ref.hasFile:
			param = "file"
		}
		if param != "" {
			var re *RequestError
			if !errors.As(err, &re) || re.Param != param {
				t.Fatalf("ParseForm(%q) = %+v, %v; want an error for %q (mime/multipart: %q, file %v, stream %q)", body, got, err, param, ref.model, ref.hasFile, ref.stream)
			}
			return
		}
		want := Form{Model: string(ref.model), HasFile: true, Stream: strings.ToLower(string(ref.stream)) == "true", ModelStart: got.ModelStart, ModelEnd: got.ModelEnd}
		if err != nil || got != want || (ref.model != nil) != (got.ModelStart > 0) {
			t.Fatalf("ParseForm(%q) = %+v, %v; mime/multipart reads %+v", body, got, err, want)
		}
	})
}
