import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.HexFormat;

import org.apache.kafka.common.message.ApiMessageType;
import org.apache.kafka.common.protocol.ApiMessage;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.ObjectSerializationCache;

/**
 * Apache Kafka's own message classes as the oracle of kafkatap's codec (tests/protocol/test_protocol_java_oracle.py).
 *
 * Reads lines "API_KEY VERSION req|resp HEX_BODY" and prints one verdict per line, in order:
 * "read HEX" when the class of that API and version reads the body to its last byte, with the body
 * as Kafka writes that message back (it leaves out tagged fields that hold their default, which a
 * writer may send); "skip" when this kafka-clients jar has no such API or version (the caller asks
 * the other release's jar); otherwise what went wrong.
 */
public final class CodecOracle {
    public static void main(String[] args) throws Exception {
        StringBuilder out = new StringBuilder();
        for (String line : Files.readAllLines(Paths.get(args[0]))) {
            String[] f = line.split(" ", -1);
            out.append(verdict(Short.parseShort(f[0]), Short.parseShort(f[1]), f[2].equals("req"),
                               HexFormat.of().parseHex(f[3]))).append('\n');
        }
        System.out.print(out);
    }

    static String verdict(short key, short version, boolean request, byte[] body) {
        ApiMessageType type;
        try {
            type = ApiMessageType.fromApiKey(key);
        } catch (RuntimeException e) {
            return "skip";
        }
        if (version < type.lowestSupportedVersion() || version > type.highestSupportedVersion(true)) {
            return "skip";
        }
        ApiMessage message = request ? type.newRequest() : type.newResponse();
        ByteBuffer in = ByteBuffer.wrap(body);
        try {
            message.read(new ByteBufferAccessor(in), version);
        } catch (RuntimeException e) {
            return "unreadable: " + e;
        }
        if (in.hasRemaining()) {
            return "left " + in.remaining() + " bytes unread";
        }
        ObjectSerializationCache cache = new ObjectSerializationCache();
        ByteBuffer again = ByteBuffer.allocate(message.size(cache, version));
        message.write(new ByteBufferAccessor(again), cache, version);
        return "read " + HexFormat.of().formatHex(again.array());
    }
}
