// A JVM reading a file through a MappedByteBuffer while its own SIGSEGV handler is busy: the
// JIT turns the null checks below into implicit ones (a load from NULL the JVM's handler
// catches and turns into a NullPointerException). Prints the file's CRC-32 and the exceptions
// caught: the same with and without granary.
//
//   java MapReader.java FILE
import java.io.RandomAccessFile;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.util.zip.CRC32;

public class MapReader {
    static Object maybe(int i) { return (i % 3 == 0) ? null : Integer.valueOf(i); }

    public static void main(String[] args) throws Exception {
        try (RandomAccessFile f = new RandomAccessFile(args[0], "r");
             FileChannel ch = f.getChannel()) {
            MappedByteBuffer b = ch.map(FileChannel.MapMode.READ_ONLY, 0, ch.size());
            CRC32 crc = new CRC32();
            byte[] chunk = new byte[1 << 16];
            long npe = 0;
            int i = 0;
            while (b.hasRemaining()) {
                int n = Math.min(chunk.length, b.remaining());
                b.get(chunk, 0, n);
                crc.update(chunk, 0, n);
                for (int k = 0; k < 64; k++, i++) {
                    try {
                        npe += maybe(i).hashCode() & 0;
                    } catch (NullPointerException e) {
                        npe++;
                    }
                }
            }
            System.out.println("{\"crc\": " + crc.getValue() + ", \"npe\": " + npe + "}");
        }
    }
}
